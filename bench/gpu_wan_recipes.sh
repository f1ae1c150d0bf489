#!/usr/bin/env bash
# bench.gpu_wan once per published recipe, in one go: the GPU run of docs/performance.md's Wan table.
#
#   bash bench/gpu_wan_recipes.sh [OUT_DIR]          # on a CUDA GPU, 480x832 (Matrix-Game 352x640), bf16
#   TINY=1 bash bench/gpu_wan_recipes.sh /tmp/out    # the same runs at a tiny size on the CPU (a dry run)
#
# Each recipe at 1, 2 and 4 sessions (Matrix-Game 1 to 4) with the full Wan2.1 VAE and the side
# stream on, then Self-Forcing and Matrix-Game again with TAEHV; each run's output goes to
# OUT_DIR/<recipe>[-tae].txt and its summary line to OUT_DIR/summary.txt. A run is cut off after
# RUN_S seconds (default 240), so one slow recipe does not take the others' time. ONLY="a b"
# keeps the runs named (recipe or recipe-tae), for a GPU lent for less time than all eleven take.
set -u
out=${1:-${OUT:-bench-out}}
mkdir -p "$out"
run_s=${RUN_S:-240}
extra=()
if [ "${TINY:-0}" = 1 ]; then extra=(--tiny --chunks 1 --sessions 1 2); fi
py=${PYTHON:-python}
runs=(
  "self-forcing --vae full" "causvid --vae full" "causvid-warp4 --vae full" "longlive --vae full"
  "longlive-infinity --vae full" "rolling-forcing --vae full" "matrix-game-2-universal --vae full"
  "matrix-game-2-gta-drive --vae full" "matrix-game-2-templerun --vae full"
  "self-forcing --vae tae" "matrix-game-2-universal --vae tae"
)
: > "$out/summary.txt"
for r in "${runs[@]}"; do
  read -r recipe _ vae <<< "$r"
  name=$recipe; [ "$vae" = tae ] && name=$recipe-tae
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then continue; fi
  echo "== $name" | tee -a "$out/summary.txt"
  # shellcheck disable=SC2086
  timeout "$run_s" "$py" -m bench.gpu_wan --recipe $r "${extra[@]}" > "$out/$name.txt" 2>&1
  rc=$?
  grep -E "^(device|gpu_wan)" "$out/$name.txt" >> "$out/summary.txt" || echo "rc=$rc (see $name.txt)" >> "$out/summary.txt"
done
cat "$out/summary.txt"
