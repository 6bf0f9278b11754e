"""The two ceilings of a roofline on this GPU: an 8192^3 bf16 matmul (TFLOP/s) and a 2 GiB device-to-device copy
(TB/s, bytes read + written), each the mean of 10 timed runs after 3 warm-ups. One JSON line.

    python3 scripts/dev/device_peaks.py
"""
import json, torch
def t(f, n=10):
    for _ in range(3): f()
    torch.cuda.synchronize(); s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n): f()
    e.record(); torch.cuda.synchronize(); return s.elapsed_time(e) / 1000 / n
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
mm = t(lambda: a @ b)
x = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
cp = t(lambda: y.copy_(x))
print(json.dumps({"device": torch.cuda.get_device_name(), "bf16_tflops": round(2 * 8192**3 / mm / 1e12, 1),
                  "copy_tbs": round(2 * x.numel() / cp / 1e12, 2)}))
