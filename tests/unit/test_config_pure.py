"""The config schema is data only: loading and validating a run config imports no runtime code.

Registry keys (engines, dispatch policies, pool hardware, environment and reward kinds) are checked
when a run is prepared (``flows/registries.py``), so the schema modules import only the standard
library, pydantic, yaml and each other. Two guards: a fresh interpreter validates a config that
reaches every validator and must not have loaded a runtime module, and every import statement of
the schema modules, those inside functions included, is read from the source.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = sorted([*ROOT.glob("services/common/*config*.py"), ROOT / "services/common/strict.py"])
SCHEMA_MODULES = {f"services.common.{p.stem}" for p in SCHEMA}
ALLOWED_THIRD_PARTY = {"pydantic", "yaml"}
RUNTIME = ("torch", "grpc", "transformers", "vllm", "numpy", "prefect", "services.tasks", "services.agentic",
           "services.generation", "services.reward", "services.trainer", "services.run", "services.rollout",
           "services.policy", "services.proto", "services.weights", "ranker", "allocator", "flows")

# Every section away from its defaults where a validator has a branch: pools and affinity, an
# agentic run, a dataset task with every kind of reward term, scale-out, the forced-length ramp.
OVERRIDES = [
    "generation.instances=2", "generation.dispatch.router='on'", "generation.forced_lengths=true",
    "generation.pools=[{name: a, hardware: H100, instances: [0]}, {name: b, instances: [1]}]",
    "generation.affinity={calculator: a, default: b}", "scaleout.enabled=true",
    "forced_length_ramp.start=8", "forced_length_ramp.per_iteration=1", "trainer.mode=sync",
    "task.kind=dataset", "task.dataset.train=rows.jsonl",
    "reward.terms=[{fn: numeric}, {fn: format, pattern: 'x+'}, {fn: 'mine.rewards:score'}]",
    "reward.kind=model", "reward.model_path=/nowhere", "agentic.latency.kind=normal", "agentic.latency.std_s=1",
]
AGENTIC = ["agentic.enabled=true", "trainer.mode=sync", "agentic.env=walk"]

PROBE = """
import json, sys
from services.common.config import load_config
load_config(None, json.loads(sys.argv[1]))
load_config(None, json.loads(sys.argv[2]))
print(json.dumps(sorted(sys.modules)))
"""


def test_validating_a_config_imports_no_runtime_module():
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(OVERRIDES), json.dumps(AGENTIC)], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    runtime = [m for m in loaded if any(m == r or m.startswith(r + ".") for r in RUNTIME)]
    assert runtime == [], f"the config schema imported runtime modules: {runtime}"
    assert "services.common.config" in loaded


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import statement in ``path``, outside ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {id(n) for node in ast.walk(tree)
                   if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                   for stmt in node.body for n in ast.walk(stmt)}
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module, f"{path.name}:{node.lineno}: relative import"
            found.append((node.lineno, node.module))
    return found


def test_schema_modules_import_only_stdlib_pydantic_yaml_and_each_other():
    assert len(SCHEMA) >= 7, [p.name for p in SCHEMA]
    bad = [f"{p.relative_to(ROOT)}:{line}: {module}" for p in SCHEMA for line, module in _imports(p)
           if module not in SCHEMA_MODULES and module.split(".")[0] not in ALLOWED_THIRD_PARTY
           and module.split(".")[0] not in sys.stdlib_module_names]
    assert bad == [], ("the config schema imports runtime code (check registry keys in flows/registries.py):\n"
                       + "\n".join(bad))
