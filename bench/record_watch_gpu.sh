#!/bin/sh
# Records what `top`'s GPU columns read on a real GPU node (tests replay it through a stand-in nvidia-smi;
# this machine has no GPU): nvidia-smi in loop mode with the fields nodeprogs/watchnode.py asks for, idle
# and under load (a PyTorch matrix-product loop), the older clocks_throttle_reasons name, and one
# `top --once` reading of the node made by the real node programs. Run on a GPU machine:
#   OUT=dir sh bench/record_watch_gpu.sh
OUT=${OUT:-watch-gpu}
mkdir -p "$OUT"
F=index,utilization.gpu,memory.used,memory.total,power.draw,power.limit,temperature.gpu,clocks.sm
loop() {  # loop NAME REASON_FIELD: 3 s of nvidia-smi's loop, every 500 ms
  timeout 3 nvidia-smi --query-gpu=$F,"$2" --format=csv,noheader,nounits --loop-ms=500 > "$OUT/$1.out" 2>&1
  echo "exit $? (124: stopped by timeout, as meant)" >> "$OUT/$1.out"
}
{ nvidia-smi --version; uname -r; python3 -c 'import torch; print("torch", torch.__version__)'; } > "$OUT/about.out" 2>&1
loop smi-loop-idle clocks_event_reasons.active
python3 -c '
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + 14
while time.time() < end:
    for _ in range(50):
        b = a @ a
    torch.cuda.synchronize()
' > "$OUT/load.out" 2>&1 &
load=$!
sleep 4
loop smi-loop-busy clocks_event_reasons.active
loop smi-loop-old-name clocks_throttle_reasons.active
python3 bench/watch_once_bare.py > "$OUT/top-once-busy.json" 2> "$OUT/top-once-busy.err"
wait $load
echo "load exit $?" >> "$OUT/load.out"
ls -l "$OUT"
