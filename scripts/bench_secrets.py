"""How long `submit` takes to leave the secrets out of a large environment (atk46-23r R4).

`submit` sends the submitter's environment (`--export=ALL`) without the secrets, which it finds
by name and by the value's shape (`ledger.core.secret_shapes.secret_value`). A shape searched
forward from every letter of a long word made that quadratic: 15 values of 16,300 letters (246 KB,
under the 256 KiB bound) took ~16 s of the submitter's CPU. This prints, in CPU time:

1. `environment("ALL", ...)` over that environment and over a module-heavy one (15 long
   `*PATH`-like values), against a raw baseline: one plain regular-expression search per value;
2. for each value shape, `secret_value` at 4,000 and 16,000 characters and their ratio: linear
   is 4, quadratic 16.

    python scripts/bench_secrets.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from collections.abc import Callable

from benchkit import machine

from ledger.cli.submit import environment
from ledger.core.secret_shapes import secret_value

SHAPES: dict[str, Callable[[int], str]] = {
    "letters": lambda n: "a" * n,
    "capitals": lambda n: "A" * n,
    "hex": lambda n: ("0123456789abcdef" * (n // 16 + 1))[:n],
    "base64": lambda n: ("QUJD" * (n // 4 + 1))[:n],
    "letters and digits": lambda n: ("a1" * (n // 2 + 1))[:n],
    "paths": lambda n: ("/opt/apps/spack/gcc-12.2.0/pkg-1.2.3-abcdefghij/lib:" * (n // 50 + 1))[:n],
    "words": lambda n: ("lorem ipsum dolor sit amet " * (n // 20 + 1))[:n],
    "spaces": lambda n: " " * n,
    "'machine '": lambda n: ("machine " * (n // 8 + 1))[:n],
    "'-eyJ'": lambda n: ("-eyJ" * (n // 4 + 1))[:n],
    # atk47-23 F1's shapes: each run starts a try of one of them at every position
    "dashes": lambda n: "-" * n,
    "newlines": lambda n: "\n" * n,
    "'-----BEGIN '": lambda n: ("-----BEGIN " * (n // 11 + 1))[:n],
    "'%2D'": lambda n: ("%2D" * (n // 3 + 1))[:n],
    "'LS0tLS1CRUdJTi'": lambda n: ("LS0tLS1CRUdJTi" * (n // 14 + 1))[:n],
    "'  token: x'": lambda n: ("  token: x\n" * (n // 11 + 1))[:n],
}


def cpu(fn: Callable[[], object], repeat: int) -> float:
    """The median CPU time of `fn` over `repeat` runs (each at least 20 ms of calls)."""
    times = []
    for _ in range(repeat):
        start, calls = time.process_time(), 0
        while True:
            fn()
            calls += 1
            if time.process_time() - start > 0.02:
                break
        times.append((time.process_time() - start) / calls)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"machine: {machine()}")
    raw = re.compile("://")
    print("1. environment('ALL', ...) (CPU time, median)")
    for name, shape in (("R4: 15 x 16,300 letters", "letters"), ("15 x 16,300 paths", "paths")):
        env = {f"BIG{i}": SHAPES[shape](16_300) for i in range(15)}
        took = cpu(lambda env=env: environment("ALL", env), args.repeat)  # type: ignore[misc]
        base = cpu(lambda env=env: [raw.search(v) for v in env.values()], args.repeat)  # type: ignore[misc]
        print(f"   {name:26s} {took * 1e3:9.2f} ms  raw {base * 1e3:6.3f} ms  "
              f"ratio {took / base:7.1f}")  # fmt: skip
    print("2. secret_value by shape: 4,000 and 16,000 characters (linear: ratio 4)")
    worst = 0.0
    for name, make in SHAPES.items():
        short, long = make(4_000), make(16_000)
        small = cpu(lambda v=short: secret_value(v), args.repeat)  # type: ignore[misc]
        large = cpu(lambda v=long: secret_value(v), args.repeat)  # type: ignore[misc]
        worst = max(worst, large / small)
        print(f"   {name:20s} {small * 1e3:8.3f} ms {large * 1e3:9.3f} ms  "
              f"ratio {large / small:5.1f}")  # fmt: skip
    print(f"worst ratio {worst:.1f} ({'linear' if worst < 6 else 'NOT linear'})")


if __name__ == "__main__":
    main()
