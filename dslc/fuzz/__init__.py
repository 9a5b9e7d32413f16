"""The differential program generator: well-typed `.cgraph` programs drawn from the op table
(each op's own type rule decides what is legal), run through the whole compiler against
independent oracles, and shrunk to a small regression case when they disagree.

generate (choices -> Program) -> oracle (Program -> Outcome) -> shrink (a failing choice
sequence -> the smallest one that still fails). `scripts/fuzz_diff.py` drives it.
"""
