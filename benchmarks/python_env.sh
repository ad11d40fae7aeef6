# Sourced by the GPU scripts (run_gpu.sh, gpu_check.sh): the repository root as the working folder and
# first on PYTHONPATH, and PYTHON (unless set): .venv/bin/python if present, else python3, else python.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python
  elif command -v python3 >/dev/null; then PYTHON=python3  # e.g. the lent GPU machine: python3 holds torch
  else PYTHON=python; fi
fi
