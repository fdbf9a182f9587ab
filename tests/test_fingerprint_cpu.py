"""fingerprint.json records the CPU instruction set torch's kernels dispatch to: across it a CPU run's
bits differ even under the mode (docs/batch-invariant-mode.md), so a comparison must be able to see it."""

import os
import subprocess
import sys

PRINT_CAPABILITY = ("from nondet.probes.core.numerics import fingerprint; "
                    "print(fingerprint({'device': 'cpu'}, 'batch-invariant')['cpu_capability'])")


def _capability(env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    if env_value is not None:
        env["ATEN_CPU_CAPABILITY"] = env_value
    proc = subprocess.run([sys.executable, "-c", PRINT_CAPABILITY], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def test_the_capability_cap_shows_in_the_fingerprint():
    # ATEN_CPU_CAPABILITY=default makes torch dispatch to its scalar kernels; the fingerprint must say so.
    assert _capability("default") == "DEFAULT"


def test_the_hosts_own_capability_is_recorded_as_torch_sees_it():
    import torch

    assert _capability(None) == torch.backends.cpu.get_cpu_capability()
