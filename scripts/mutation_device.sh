#!/usr/bin/env bash
# One mutation group (scripts/mutation.py) on the device machine's 16 CPU cores, its GPU hidden:
# this machine has 2, on which `ops` and `lower` take longer than a sitting. The results come
# back as mutmut's result files; a later call goes on from them.
#
# Here, first (the device machine has neither mutmut nor the CI's mypy):
#   pip download -d .mutwhl --python-version 3.12 --only-binary=:all: \
#       --platform manylinux_2_28_x86_64 mutmut==3.8.1        # its wheels, for the device's Python
#   scripts/mutation.py GROUP --typecheck-elsewhere             # mutants + mypy.json, made here
# then, with no change to the code or tests in between (checked: code.sha), with the device tool,
# carrying .whl, .mutwhl, build/mutation/GROUP/mutants, build/mutation/GROUP/mypy.json and
# build/mutation/GROUP/code.sha:
#   OUT=$OUT LIMIT=540 [MODULES="GLOB ..."] scripts/mutation_device.sh GROUP
# and back here, DIR the folder the call's files came back in:
#   scripts/mutation.py GROUP --unpack DIR       # into build/mutation/GROUP, then mutation/GROUP.json
# Each call pays mutmut's start (the group's tests once, ~2-5 minutes, and the first call
# mapping tests to functions): give it the whole 10 minutes a call may take.
# That machine's packages are not the CI's: a test that passes here may fail there (session 18:
# its PyTorch cast out-of-range values to fp8 as NaN; the test now states the values), and
# mutmut then stops with "failed to collect stats". The group's tests then run once more, with
# mutmut's own pytest arguments, to name the failing one. (Leaving a test out there through
# those arguments would change mutmut's fingerprint of its configuration, and it would start
# the group over.)
set -u
group=${1:?usage: mutation_device.sh GROUP}
out=${OUT:?set OUT}
cd "$(dirname "$0")/.."
for wheels in .whl .mutwhl; do
  python3 -m pip install -q --no-index --no-deps --no-compile --target "/tmp/$wheels" $wheels/*.whl \
    >> "$out/pip.log" 2>&1 || { cat "$out/pip.log"; exit 1; }
done
# not the checkout: the tests import the mutants
export PYTHONPATH=/tmp/.mutwhl:/tmp/.whl PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=""
python3 - "$group" "${MODULES:-}" <<'PY'
import re, sys
sys.path.insert(0, "scripts")
import mutation
config, files = mutation.scope()
folder = mutation.prepare(sys.argv[1], config, files, fresh=False)
made = (folder / "code.sha").read_text().strip() if (folder / "code.sha").exists() else "none"
if made != mutation.code_digest():  # the mutants and mypy.json are of other code or tests
    sys.exit(f"the code or tests changed since `scripts/mutation.py {sys.argv[1]} "
             "--typecheck-elsewhere` made the mutants carried here: run it again, then this")
path = folder / "pyproject.toml"  # mypy's verdict as made on the other machine
path.write_text(re.sub(r"type_check_command = .*",
                       'type_check_command = ["sh", "-c", "cat ../mypy.json", "mypy"]',
                       path.read_text()))
names = mutation.untested(folder, sys.argv[2].split()) if sys.argv[2] else []
(folder / "names.txt").write_text("".join(n + "\n" for n in names))
PY
[ $? -eq 0 ] || exit 3
cd "build/mutation/$group"
# MODULES="GLOB ...": only those modules' untested mutants (the rest of the group runs elsewhere)
timeout "${LIMIT:-540}" python3 -m mutmut run --max-children "${JOBS:-15}" $(cat names.txt) \
  > "$out/mutmut.log" 2>&1
echo "mutmut exit $? (124: stopped at LIMIT, the results so far kept)" | tee -a "$out/mutmut.log"
if grep -q "failed to collect stats" "$out/mutmut.log"; then  # which test fails on this machine
  python3 - <<'PY' 2>&1 | tail -5 | tee -a "$out/mutmut.log"
import tomllib, pytest
c = tomllib.load(open("pyproject.toml", "rb"))["tool"]["mutmut"]
pytest.main(["-x", "-q", "--tb=line", *c["pytest_add_cli_args"],
             *c["pytest_add_cli_args_test_selection"]])
PY
fi
cp mutants/mutmut-stats.json "$out/"
(cd mutants && find dslc -name '*.meta' | tar cf "$out/meta.tar" -T -)
tr '\r' '\n' < "$out/mutmut.log" | grep -E "/[0-9]+ " | tail -1
