"""What a generated runner imports: checking inputs against the manifest, and (with a GPU)
bundle loading, plan restore, memory plan and execution. Imports nothing of the compiler."""
