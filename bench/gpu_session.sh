#!/bin/bash
# Every GPU check in one command, for a CUDA machine that may have no network and little time:
# the CUDA tests, where a fresh process's load spends its time (bench/gpu_profile.py), what the fill's
# threads cost the main thread on its cores (bench/ring_sim.py, with and without the shared reads), and
# the GPU suite with its peers side by side (bench/gpu.py --explore), against an older weightio too.
#
#   bench/gpu_session.sh --prepare [COMMIT]   # here, with network: wheels into .whl/, COMMIT's weightio
#                                             # (default HEAD) into .devrun/before/ (both git-ignored
#                                             # locally by .git/info/exclude: carry them along)
#   bench/gpu_session.sh [OUT]                # there, from the repository's root: logs, gpu.json and the
#                                             # updated docs/benchmarks.md into OUT (default: $OUT, else
#                                             # /tmp/gpu-session)
#
# On the GPU machine its python3 must hold torch with CUDA (and numpy, ml_dtypes, click, safetensors,
# pytest); the wheels add what it lacks (msgspec, fickling, the peers: fastsafetensors, the Run:ai
# streamer, InstantTensor), installed into /tmp/site. weightio runs from the checkout (PYTHONPATH),
# its C module compiled in place with gcc, as is the older copy's. GPU_SESSION_SECONDS (default 540)
# bounds the whole run: the suite gets what the tests and the profile leave.
set -u
if [ "${1:-}" = "--prepare" ]; then
    commit=${2:-HEAD}
    mkdir -p .git/info .whl
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    grep -qx '/.devrun/' .git/info/exclude 2>/dev/null || echo '/.devrun/' >> .git/info/exclude
    platforms=""
    for n in 2_17 2_24 2_27 2_28 2_31 2_34 2_35; do platforms="$platforms --platform manylinux_${n}_x86_64"; done
    for wheel in msgspec fickling fastsafetensors==0.5.0 runai-model-streamer==0.17.1 instanttensor==0.2.2; do
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            $platforms --platform manylinux2014_x86_64 -d .whl "$wheel" || exit 1
    done
    rm -rf .devrun/before && mkdir -p .devrun/before && git archive "$commit" weightio | tar -x -C .devrun/before
    du -sh .whl .devrun
    exit 0
fi

out=${1:-${OUT:-/tmp/gpu-session}}
budget=${GPU_SESSION_SECONDS:-540}
start=$SECONDS
mkdir -p "$out"
export OUT="$out" PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:/tmp/site" WEIGHTIO_BENCH_DIR=${WEIGHTIO_BENCH_DIR:-/tmp/weightio-bench}
if ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
include="-I$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])') -I$(python3 -c 'import numpy; print(numpy.get_include())')"
suffix=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
before=""
[ -d .devrun/before/weightio ] && before="$PWD/.devrun/before"
for tree in . $before; do
    gcc -O3 -shared -fPIC -pthread $include "$tree/weightio/_speedups.c" -o "$tree/weightio/_speedups$suffix" \
        || echo "no C module in $tree: weightio runs in Python there"
done
python3 -c "import torch, weightio; print('weightio from', weightio.__file__, '| torch', torch.__version__, '|',
torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA GPU')"
nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv \
    2> /dev/null
echo "== set up in $((SECONDS - start)) s"

timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_devices.py 2>&1 | tee "$out/tests.txt" | tail -8
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_torch_workflows.py -k gpu 2>&1 | tee -a "$out/tests.txt" | tail -3
echo "== tests done at $((SECONDS - start)) s"
timeout 90 python3 bench/gpu_profile.py --reps 1 2>&1 | tee "$out/profile.txt"
echo "== profile done at $((SECONDS - start)) s"
for flag in "" --task-a-piece; do  # what the fills cost the main thread, on this machine's cores (no GPU used)
    timeout 40 python3 bench/ring_sim.py --reps 5 $flag 2>&1 | tail -2 | sed "s/^/ring_sim ${flag:-shared}: /"
done | tee "$out/ring_sim.txt"
echo "== ring_sim done at $((SECONDS - start)) s"
left=$((budget - (SECONDS - start) - 10))
WEIGHTIO_BEFORE=$before timeout "$left" python3 bench/gpu.py --reps 5 --explore --seconds $((left - 20)) 2>&1 \
    | tee "$out/gpu.txt"
cp docs/benchmarks.md "$out/"
echo "== all done at $((SECONDS - start)) s"
