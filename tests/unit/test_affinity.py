import os
import subprocess
import sys

import pytest

from services.common.affinity import pin_cpus
from services.common.config import ConfigError, load_config


def test_pin_restricts_the_process_and_its_threads():
    cpu = min(os.sched_getaffinity(0))
    code = (
        "import os, threading; from services.common.affinity import pin_cpus; "
        f"pin_cpus([{cpu}], 't'); out = []; "
        "t = threading.Thread(target=lambda: out.append(sorted(os.sched_getaffinity(0)))); t.start(); t.join(); "
        "print(sorted(os.sched_getaffinity(0)), out[0])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"[{cpu}] [{cpu}]"


def test_unavailable_cpu_is_named():
    with pytest.raises(ValueError, match=r"trainer: CPUs \[100000\] are not available"):
        pin_cpus([100000], "trainer")


def test_empty_list_leaves_the_process_alone():
    before = os.sched_getaffinity(0)
    pin_cpus([], "sgs")
    assert os.sched_getaffinity(0) == before


def test_negative_cpu_rejected_by_config():
    with pytest.raises(ConfigError, match=r"generation.cpus"):
        load_config(None, ["generation.cpus=[-1]"])
