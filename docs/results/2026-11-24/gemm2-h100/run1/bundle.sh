#!/usr/bin/env bash
# Builds /work/main/gpu-bundle-gemm: new.tgz (the gemm2 build: libmaco, bench_gemm_tile,
# test_persistent_gpu, maco-run), base.tgz (main's libmaco + bench_gemm_tile snapshot) and run.sh.
set -euo pipefail
dst=/work/main/gpu-bundle-gemm
rm -rf "$dst" /tmp/gb && mkdir -p "$dst" /tmp/gb/new /tmp/gb/base
B=/work/gemm2/build
cp -a $B/libmaco.so $B/libmaco.so.0 $B/libmaco.so.0.1.0 $B/tests/bench_gemm_tile $B/tests/test_persistent_gpu $B/tools/maco-run /tmp/gb/new/
for j in /usr/lib/x86_64-linux-gnu/libjansson.so.4; do cp -L $j /tmp/gb/new/; cp -L $j /tmp/gb/base/; done
cp -a /work/base-snap/* /tmp/gb/base/
strip --strip-debug /tmp/gb/new/libmaco.so.0.1.0 /tmp/gb/base/libmaco.so.0.1.0 /tmp/gb/new/bench_gemm_tile /tmp/gb/new/test_persistent_gpu /tmp/gb/base/bench_gemm_tile
(cd /tmp/gb && tar czf $dst/new.tgz new && tar czf $dst/base.tgz base)
cp /work/gemm2-tools/run.sh $dst/run.sh
du -sh $dst
