#!/usr/bin/env bash
# The install as a program outside this repository sees it: `cmake --install` of BUILD into a temporary
# prefix, then examples/ddp_example.cpp with examples/standalone/CMakeLists.txt copied to a temporary
# directory, configured with find_package(cohort) against that prefix alone, built, and run on 2 ranks
# (torchrun-style variables); the loss must fall. A file including headers at their old paths builds
# too, and so does the example as the last release wrote it (tests/install/old_example.cpp: the names
# before namespaces followed folders). The temporary directory is removed afterwards.
#
#   tests/install/find_package_program.sh BUILD_DIR SOURCE_DIR [PORT]
set -euo pipefail
build=$(realpath "$1"); src=$(realpath "$2"); port=${3:-29765}
tmp=$(mktemp -d /tmp/cohort-install.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

cmake --install "$build" --prefix "$tmp/prefix" > "$tmp/install.log"
for f in bin/cohort include/cohort/parallel/ddp/DistributedDataParallel.h lib/cmake/cohort/cohortConfig.cmake; do
  [[ -e $tmp/prefix/$f ]] || { echo "install lacks $f"; exit 1; }
done
mkdir "$tmp/app"
cp "$src/examples/ddp_example.cpp" "$src/examples/standalone/CMakeLists.txt" "$src/tests/install/old_example.cpp" \
  "$tmp/app/"
# A header at the path it had before it moved (Note [Headers that moved keep their old path for one
# release] in src/CMakeLists.txt), named the old way, must still build: three that need no LibTorch
# header, so that this file compiles in a second.
cat > "$tmp/app/old_paths.cpp" << 'EOF'
#include "cohort/swarm/Wire.h"
#include "cohort/train/PhaseClock.h"
#include "cohort/train/Progress.h"
int old_paths() {
  return cohort::train::kPhaseCount + static_cast<int>(cohort::train::Progress::clock(61).size()) +
         static_cast<int>(cohort::swarm::Writer().u64(1).out().size());
}
EOF
printf 'add_library(old_paths OBJECT old_paths.cpp)\ntarget_link_libraries(old_paths PRIVATE cohort::cohort)\n' \
  >> "$tmp/app/CMakeLists.txt"
printf 'add_executable(old_example old_example.cpp)\ntarget_link_libraries(old_example PRIVATE cohort::cohort)\n' \
  >> "$tmp/app/CMakeLists.txt"
# ccache's base_dir: the paths under this run's fresh temporary directory are given to the cache as
# relative ones, so a second run of the test finds the objects of the first (3 LibTorch translation units:
# 21 s of the test's 28 on a 2-core machine, 2026-12-03) whenever the installed headers are unchanged.
launcher=(); command -v ccache > /dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
export CCACHE_BASEDIR=$tmp
cmake -S "$tmp/app" -B "$tmp/app/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$tmp/prefix" \
  "${launcher[@]}" > "$tmp/configure.log" 2>&1 || { cat "$tmp/configure.log"; exit 1; }
cmake --build "$tmp/app/build" -j "$(nproc)" > "$tmp/build.log" 2>&1 || { tail -40 "$tmp/build.log"; exit 1; }

pids=()
for rank in 0 1; do
  RANK=$rank WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 300 "$tmp/app/build/ddp_example" \
    > "$tmp/rank$rank.log" 2>&1 &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
cat "$tmp/rank0.log"
[[ $status -eq 0 ]] || { echo "a rank failed (exit $status):"; cat "$tmp/rank1.log"; exit 1; }
loss=$(grep -o 'epoch 2 loss [0-9.]*' "$tmp/rank0.log" | awk '{print $4}')
[[ -n $loss ]] || { echo "no 'epoch 2 loss' line"; exit 1; }
awk -v l="$loss" 'BEGIN { exit !(l < 0.5) }' || { echo "loss $loss did not fall below 0.5"; exit 1; }
echo "find_package(cohort) program trained on 2 ranks: epoch 2 loss $loss"
