#!/usr/bin/env bash
# The course's GPU report in one command, for a GPU machine lent for a few minutes (10 at most):
#   benchmarks/gpu_report.sh                  # on the GPU machine (--device cuda is the default)
#   benchmarks/gpu_report.sh --device cpu     # the same steps on a CPU: how the script is tested
#   benchmarks/gpu_report.sh --out DIR        # write somewhere else than ampteach/results/
#
# 1. installs the course without its dependencies (such a machine has torch, numpy, matplotlib and tqdm, and
#    often no network; torch may be older than the course's, 2.11 has been seen), or runs it from the checkout;
# 2. E.6.1: `ampteach bench`, fp32 vs fp16 + GradScaler vs bf16, torch.amp and ampteach -> <out>/<machine>.json;
# 3. the lessons' GPU measurements (benchmarks/gpu_lessons.py): the roofline and the width sweep of lesson 7,
#    and the numerics the CPU lessons could only emulate -> <out>/roofline/<machine>.json, <out>/<machine>-lessons.md;
# 4. the CUDA-marked tests (pytest -m cuda, without the notebook plugin) -> <out>/<machine>-tests.txt;
# 5. every lesson executed with AMPTEACH_DEVICE=<device> (benchmarks/run_lessons.py, nbclient, 5 minutes a cell,
#    8 minutes in all) -> <out>/gpu/<machine>/<lesson>.ipynb, summary.json, summary.md (on --device cpu: under
#    <out>/cpu-run/). Where nbclient or ipykernel is missing and a wheel folder .whl/ was carried along, they are
#    installed from it (pip --no-index).
# <machine> is ampteach.training.machine.machine_tag(device), e.g. cuda-nvidia-h100-80gb-hbm3. Each step has
# its own time limit, and a failing step does not stop the others; the exit code says whether all passed.
set -uo pipefail
cd "$(dirname "$0")/.."
DEVICE=cuda
OUT=ampteach/results
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "gpu_report.sh: unknown argument $1 (see --help)"; exit 2 ;;
  esac
done
case "$DEVICE" in cpu|cuda) ;; *) echo "gpu_report.sh: --device must be cpu or cuda, got $DEVICE"; exit 2 ;; esac
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg

step() { echo; echo "== $*"; }

step "1/5 install (no dependencies, no network)"
if ! "$PY" -m pip install --quiet --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1; then
  echo "pip could not install the checkout here: running it from the checkout (PYTHONPATH)"
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
"$PY" - "$DEVICE" <<'PYEOF' || exit 1
import sys
import torch
import ampteach
from ampteach.training.machine import machine_line
device = sys.argv[1]
if device == "cuda" and not torch.cuda.is_available():
    sys.exit(f"--device cuda, but torch {torch.__version__} sees no GPU here; use --device cpu")
print(f"ampteach {ampteach.__version__} from {ampteach.__file__}")
print(machine_line(device))
PYEOF
TAG="$("$PY" -c "from ampteach.training.machine import machine_tag; print(machine_tag('$DEVICE'))")"
mkdir -p "$OUT/roofline"
status=0

step "2/5 E.6.1: ampteach bench --device $DEVICE -> $OUT/$TAG.json"
if [ "$DEVICE" = cuda ]; then bench_args=(--repeat 3); else bench_args=(--epochs 1 --configs fp32,bf16); fi
timeout 240 "$PY" -m ampteach bench --device "$DEVICE" "${bench_args[@]}" --no-progress --out "$OUT/$TAG.json" \
  || { echo "bench failed or ran past 4 minutes"; status=1; }

step "3/5 the lessons' GPU measurements -> $OUT/roofline/$TAG.json, $OUT/$TAG-lessons.md"
timeout 240 "$PY" benchmarks/gpu_lessons.py --device "$DEVICE" --roofline "$OUT/roofline/$TAG.json" \
  --markdown "$OUT/$TAG-lessons.md" || { echo "gpu_lessons.py failed or ran past 4 minutes"; status=1; }

step "4/5 the CUDA-marked tests -> $OUT/$TAG-tests.txt"
# Only the files with CUDA-marked tests; --noconftest: the root conftest needs nbval (the notebooks), which a bare
# GPU machine lacks; -o addopts= drops its nbval options. On a CPU the CUDA tests skip: the run shows they are found.
mapfile -t cuda_tests < <(grep -l "pytest.mark.cuda" tests/test_*.py)
timeout 240 "$PY" -m pytest -q --noconftest -o addopts= -p no:cacheprovider -m cuda -rs "${cuda_tests[@]}" 2>&1 \
  | tee "$OUT/$TAG-tests.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "the CUDA tests failed or ran past 4 minutes"; status=1; }

if [ "$DEVICE" = cuda ]; then LESSONS_OUT="$OUT/gpu/$TAG"; else LESSONS_OUT="$OUT/cpu-run"; fi
step "5/5 every lesson with AMPTEACH_DEVICE=$DEVICE -> $LESSONS_OUT"
if ! "$PY" -c "import nbclient, ipykernel" 2>/dev/null && [ -d .whl ]; then
  "$PY" -m pip install --quiet --no-index --find-links .whl nbclient ipykernel nbformat 2>&1 | tail -2
fi
timeout 600 "$PY" benchmarks/run_lessons.py --device "$DEVICE" --out "$LESSONS_OUT" --cell-timeout 300 --budget 480 \
  || { echo "some lessons failed, or ran past the budget (see $LESSONS_OUT/summary.md)"; status=1; }

echo
echo "wrote:"; ls -l "$OUT/$TAG.json" "$OUT/roofline/$TAG.json" "$OUT/$TAG-lessons.md" "$OUT/$TAG-tests.txt" \
  "$LESSONS_OUT/summary.md" 2>&1
exit $status
