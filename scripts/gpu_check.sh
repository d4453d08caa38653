#!/usr/bin/env bash
# The GPU checks and benchmarks of the open performance work, in one go on a machine with an
# NVIDIA GPU (sm_90a): builds Release into build/ (ninja when present), then runs the steps named
# on the command line (default: all but ncu and ncu-algproj), each under a time limit, with its full log in OUT_DIR and a
# short summary printed last. Benchmark results are written to OUT_DIR/results (copy them to
# bench/results to record them); every results folder is also packed into OUT_DIR/results.tgz,
# one file to copy back.
#
#   scripts/gpu_check.sh OUT_DIR [tests] [memcheck] [relation] [ncu] [algproj] [ncu-algproj] [model]
#                        [algmodel] [algtests] [unverified] [tmastream] [ablation]
#
#   tests     the GPU test suite but the algebraic-projection tests
#   memcheck  compute-sanitizer memcheck on flash tests whose kernels load by TMA (the forward, the
#             two passes and the warp-specialized dK/dV pass), when compute-sanitizer is installed
#   relation  quiver bench relation --device cuda (FlashRelation and attention, the two passes and
#             the one-pass dQ, with the PyTorch peer when python3 has a CUDA torch)
#   ncu       Nsight Compute on the flash kernels at the 30M shape (FlashRelation's and attention's
#             forward, dK/dV and dQ passes, the defaults; the first 6 launches of bench relation's
#             warm-up): speed of light, warp states and occupancy in OUT_DIR/ncu-sections.log, pipe
#             use and instruction counts in OUT_DIR/ncu-metrics.log, and a summary of both
#   algproj   quiver bench algproj --device cuda --paper-q --clock-probe (the algebra paper's Table 1, with
#             the algebraic times 30 ms after dense as well)
#   ncu-algproj  Nsight Compute on the algebraic-projection forward chosen by calibration for one
#             Table 1 row (ALGPROJ_MODEL, default Qwen3-8B; ALGPROJ_M): calibrated first without
#             the profiler (its kernel cache in OUT_DIR/ncu-kernel-cache), then the timed runs'
#             first launches profiled, in OUT_DIR/ncu-algproj.log, and their DRAM, L2 and L1 byte
#             counts in OUT_DIR/ncu-algproj-bytes.log; ALGPROJ_M sets the rows (default 2048)
#   model     quiver bench model --device cuda: the Relation, MHA and hybrid presets' training tok/s
#   algmodel  quiver bench model --device cuda: alg110m-q2x2 against alg110m-dense, training tok/s and
#             generation at batch 1 and 64, in one process
#   algtests  the algebraic-projection GPU tests (a few minutes)
#   unverified  the GPU test of each kernel that joins calibration only where
#             QUIVER_ALGPROJ_UNVERIFIED names it (cuda/algproj.h), each in a process of its own, then
#             Table 1 as algproj does with those that passed among the candidates and a fresh kernel
#             cache (OUT_DIR/unverified-kernel-cache/kernels.json lists every candidate's time)
#   tmastream build/bin/quiver_tma_stream: the TMA row pass's W stream with no products, by ring
#             depth, from DRAM and from L2 (docs/decisions.md)
#   ablation  build/bin/quiver_tma_ablation*: the TMA row pass's forward at four Table 1 shapes as
#             it is and with its loads, products and/or stores switched off (ABLATION_CONFIGS:
#             indexes of kAlgTmaConfigs; built with -DQUIVER_TMA_ABLATION=ON when this step is asked)
# Environment: LIMIT (seconds per step, default 540), ALGPROJ_MODEL and ALGPROJ_M (ncu-algproj's row
# and rows), NO_BUILD=1 (run the binaries already in build/, built elsewhere for sm_90a).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then
  sed -n '2,/^# Environment/p' "$0"
  exit 2
fi
out="$1"
shift
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests memcheck relation algproj model algmodel algtests)
limit="${LIMIT:-540}"
mkdir -p "$out/results"
summary=()

generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
start=$(date +%s)
ablation=OFF
[[ " ${steps[*]} " == *" ablation "* ]] && ablation=ON
if [ "${NO_BUILD:-0}" = 1 ]; then
  summary+=("build: skipped (NO_BUILD=1)")
elif ! { cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DQUIVER_TMA_ABLATION="$ablation" &&
         cmake --build build -j "$(nproc)"; } \
    > "$out/build.log" 2>&1; then
  tail -40 "$out/build.log"
  echo "build failed (log: $out/build.log)"
  exit 1
else
  summary+=("build: ok in $(( $(date +%s) - start )) s")
fi
tests=build/tests/quiver_gpu_tests
Q=build/bin/quiver
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)  # memory checker

# run NAME COMMAND...: the command under the time limit, its log in OUT_DIR/NAME.log.
run() {
  local name="$1"
  shift
  local t0=$(date +%s)
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  local verdict="ok"
  [ $rc -eq 124 ] && verdict="timed out after ${limit} s"
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && verdict="failed (exit $rc)"
  local passed
  passed=$(grep -E '^\[  (PASSED|FAILED)  \]' "$out/$name.log" | tr '\n' ' ')
  summary+=("$name: $verdict in $(( $(date +%s) - t0 )) s ${passed}")
  echo "== $name: $verdict"
  tail -25 "$out/$name.log"
  return $rc
}

for step in "${steps[@]}"; do
  case "$step" in
    tests) run tests "$tests" --gtest_filter='-GpuAlgProj.*' ;;
    algtests) run algtests "$tests" --gtest_filter='GpuAlgProj.*' ;;
    unverified)
      passed=()
      for pair in two-group:TmaTwoGroupForward cluster-split:TmaClusterSplitDx diagonal-gemm:TmaWeightDiagonalGemm; do
        run "unverified-${pair%%:*}" "$tests" --gtest_filter="GpuAlgProj.${pair#*:}" && passed+=("${pair%%:*}")
      done
      if [ ${#passed[@]} -gt 0 ]; then
        names=$(IFS=,; echo "${passed[*]}")
        mkdir -p "$out/unverified-kernel-cache"
        QUIVER_CACHE_DIR="$out/unverified-kernel-cache" QUIVER_ALGPROJ_UNVERIFIED="$names" run unverified-algproj "$Q" \
          bench algproj --device cuda --paper-q --clock-probe --results-dir "$out/results-unverified"
        summary+=("unverified-algproj ran with QUIVER_ALGPROJ_UNVERIFIED=$names")
      else
        summary+=("unverified-algproj: skipped (no test passed; a fault would end the bench)")
      fi
      ;;
    memcheck)
      # Relation cases 4 and 13: widths 64 and 48 (one-pass dQ, and two passes for case 4); case 5:
      # width 80 (two passes, warp-specialized dK/dV); attention case 5: width 80 (two passes).
      if [ -x "$cs" ]; then
        run memcheck "$cs" --tool memcheck "$tests" \
          --gtest_filter='Shapes/GpuRelation.OnePassDq*/4:Shapes/GpuRelation.OnePassDq*/13:Shapes/GpuRelation.Forward*/4:Shapes/GpuRelation.Forward*/5:Shapes/GpuAttention.Forward*/5'
      else
        summary+=("memcheck: skipped (no compute-sanitizer)")
      fi
      ;;
    relation) run relation "$Q" bench relation --device cuda --results-dir "$out/results" ;;
    ncu)
      ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2> /dev/null)
      if [ -z "$ncu_bin" ]; then
        summary+=("ncu: skipped (no ncu)")
      else
        app=("$Q" bench relation --device cuda --shapes 32:2048:8:64 --peer none --runs 3 --dq two-pass
             --results-dir "$out/results-ncu")
        kernels='regex:forward_kernel|dkdv_wgmma_kernel|dq_wgmma_kernel'
        run ncu-sections "$ncu_bin" --clock-control none -k "$kernels" -c 6 --section SpeedOfLight \
          --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
          --section Occupancy --section LaunchStats --print-details all "${app[@]}"
        run ncu-metrics "$ncu_bin" --clock-control none -k "$kernels" -c 6 --metrics \
          smsp__inst_executed.sum,sm__cycles_elapsed.avg,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,smsp__warps_active.avg.per_cycle_active \
          "${app[@]}"
        grep -hE '^  [a-z].*\(|Duration|Issue Slots Busy|Warp Cycles Per Issued|Achieved Occupancy|pipe_|inst_executed.sum' \
          "$out/ncu-sections.log" "$out/ncu-metrics.log" | cut -c1-160
      fi
      ;;
    algproj) run algproj "$Q" bench algproj --device cuda --paper-q --clock-probe --results-dir "$out/results" ;;
    ncu-algproj)
      ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2> /dev/null)
      if [ -z "$ncu_bin" ]; then
        summary+=("ncu-algproj: skipped (no ncu)")
      else
        app=("$Q" bench algproj --device cuda --paper-q --model "${ALGPROJ_MODEL:-Qwen3-8B}" --m-list "${ALGPROJ_M:-2048}"
             --no-backward --quick --results-dir "$out/results-ncu-algproj")
        mkdir -p "$out/ncu-kernel-cache"
        QUIVER_CACHE_DIR="$out/ncu-kernel-cache" run ncu-algproj-calibrate "${app[@]}"
        QUIVER_CACHE_DIR="$out/ncu-kernel-cache" run ncu-algproj "$ncu_bin" --clock-control none \
          -k 'regex:^algproj_(kernel|tma_kernel|rows_kernel|pair_kernel)' -c 3 --section SpeedOfLight \
          --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats \
          --print-details all "${app[@]}"
        # The byte counts of docs/decisions.md's row-pass entries: DRAM, L2 -> L1, L2 write sectors.
        QUIVER_CACHE_DIR="$out/ncu-kernel-cache" run ncu-algproj-bytes "$ncu_bin" --clock-control none \
          -k 'regex:^algproj_(kernel|tma_kernel|rows_kernel|pair_kernel)' -c 3 --metrics \
          dram__bytes_read.sum,dram__bytes_write.sum,l1tex__m_xbar2l1tex_read_bytes.sum,lts__t_bytes.sum,lts__t_sectors_srcunit_tex_op_write.sum,lts__t_requests_srcunit_tex_op_write.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum \
          "${app[@]}"
        grep -hE '^  [a-z].*\(|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Warp Cycles Per Issued|dram__|lts__|l1tex__' \
          "$out/ncu-algproj.log" "$out/ncu-algproj-bytes.log" | cut -c1-160
      fi
      ;;
    model)
      run model "$Q" bench model --device cuda --generate "" --results-dir "$out/results" --train \
        rel10m-relation:64:1024,rel10m-mha:64:1024,rel30m-relation:16:2048,rel30m-mha:16:2048,rel100m-relation:4:4096,rel100m-mha:4:4096,hybrid30m:16:2048
      ;;
    algmodel)
      run algmodel "$Q" bench model --device cuda --results-dir "$out/results" \
        --train alg110m-dense:40:1536,alg110m-q2x2:40:1536 --generate alg110m-dense,alg110m-q2x2 --batches 1,64
      ;;
    tmastream) run tmastream build/bin/quiver_tma_stream ;;
    ablation)
      # Qwen3-8B at M = 2048 and 32, Qwen3-32B and Qwen3-4B at 2048, all at q = 32.
      ablate() {
        for b in build/bin/quiver_tma_ablation build/bin/quiver_tma_ablation_no-*; do
          for shape in "4096 12288 32 2048" "4096 12288 32 32" "5120 25600 32 2048" "2560 9728 32 2048"; do
            # shellcheck disable=SC2086
            "$b" $shape ${ABLATION_CONFIGS:-2 5 10 11 12} | sed "s|^|$(basename "$b") |" || return 1
          done
        done
      }
      export -f ablate
      run ablation bash -c ablate
      ;;
    *) echo "unknown step '$step' (tests, memcheck, relation, ncu, algproj, ncu-algproj, model, algmodel, algtests, unverified, tmastream, ablation)"; exit 2 ;;
  esac
done

echo
echo "summary ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), $(date -u +%F)):"
printf '  %s\n' "${summary[@]}"
( cd "$out" && tar -czf results.tgz --exclude=results.tgz results* 2> /dev/null ) && echo "  results packed: $out/results.tgz"
