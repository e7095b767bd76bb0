"""The machine's matrix-product rate, as torch measures it: the floor that model FLOP
utilization is stated against. Prints one line.

  python3 bench/peers/matmul_rate.py          # bf16 8192^3 on the first GPU
  python3 bench/peers/matmul_rate.py --cpu    # bf16 and fp32 1024^3 on the CPU
"""
import argparse
import time

import torch


def rate(n, dtype, device, warmups, repeats):
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmups):
        torch.mm(a, b)
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        torch.mm(a, b)
    sync()
    seconds = (time.perf_counter() - start) / repeats
    return 2 * n**3 / seconds / 1e12


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="measure on the CPU (no GPU needed)")
    args = parser.parse_args()
    if args.cpu:
        device = torch.device("cpu")
        parts = [f"{name} {rate(1024, dtype, device, 2, 5):.3f}" for name, dtype in
                 (("bf16", torch.bfloat16), ("fp32", torch.float32))]
        print(f"matmul 1024^3 on the CPU ({torch.get_num_threads()} threads), TFLOP/s: " + ", ".join(parts)
              + " (mean of 5 after 2 warm-ups)")
        return
    device = torch.device("cuda", 0)
    tflops = rate(8192, torch.bfloat16, device, 3, 10)
    print(f"bf16 matmul 8192^3 on {torch.cuda.get_device_name(device)}: {tflops:.0f} TFLOP/s "
          "(mean of 10 after 3 warm-ups)")


if __name__ == "__main__":
    main()
