"""The experiment trackers a run can log to (``tracking: [tensorboard, mlflow, wandb]``).

One small interface, ``Tracker``: ``start`` (the run's name and its resolved config as flat
parameters), ``log`` (one ``metrics.jsonl`` row's numbers at its iteration), ``finish`` (the
summary's numbers, the report's files, the run's outcome). ``flows/tracking.py`` drives them on a
thread of the flow process, off the training path. Where each one writes:

- ``tensorboard``: event files in ``<run dir>/tensorboard`` (torch's ``SummaryWriter``); the
  config as hyperparameters and a text panel, the summary as ``summary/*`` scalars, the plots as
  images.
- ``mlflow``: a run in experiment ``$MLFLOW_EXPERIMENT_NAME`` (default ``braid``) on
  ``$MLFLOW_TRACKING_URI``; unset, MLflow's own local store, ``sqlite:///<runs dir>/mlflow.db``
  with artifacts beside it in ``<runs dir>/mlartifacts``. The config as params, the summary as
  ``summary/*`` metrics, the report and plots as artifacts under ``report/``.
- ``wandb``: a run in ``$WANDB_PROJECT`` (default ``braid``), offline unless ``$WANDB_MODE`` says
  otherwise (``wandb sync`` uploads it later); files in ``<run dir>/wandb``. The config as the
  run's config, the summary in the run's summary, the plots as images and the report as a file.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Protocol


class Tracker(Protocol):
    name: str

    def start(self, run_name: str, params: dict[str, str | int | float | bool]) -> None: ...

    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def finish(self, step: int, summary: dict[str, float], files: list[Path], ok: bool) -> None: ...

    def where(self) -> dict[str, str]: ...


class TensorBoardTracker:
    name = "tensorboard"

    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        self.log_dir = run_dir / "tensorboard"
        self.writer = SummaryWriter(log_dir=str(self.log_dir))
        self.params: dict = {}

    def where(self) -> dict[str, str]:
        return {"log_dir": str(self.log_dir)}

    def start(self, run_name: str, params: dict) -> None:
        self.params = params
        text = "\n".join(f"    {k} = {v}" for k, v in params.items())  # an indented markdown code block
        self.writer.add_text("config", text, 0)
        self.writer.flush()

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def finish(self, step: int, summary: dict[str, float], files: list[Path], ok: bool) -> None:
        import matplotlib.image

        for path in files:
            if path.suffix == ".png":
                image = matplotlib.image.imread(path)[..., :3]  # RGBA -> RGB, floats in [0, 1]
                self.writer.add_image(f"report/{path.stem}", image, step, dataformats="HWC")
            elif path.suffix == ".md":
                self.writer.add_text(f"report/{path.stem}", path.read_text(), step)
        # the hparams panel: the config beside the summary's numbers (also written as summary/* scalars)
        self.writer.add_hparams(self.params, summary, run_name=".", global_step=step)
        self.writer.close()


_MLFLOW_BATCH = 100  # MLflow's limit of params in one log_batch call (metrics: 1000)


class MlflowTracker:
    name = "mlflow"

    def __init__(self, run_dir: Path) -> None:
        from mlflow import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        root = run_dir.parent.resolve()
        self.artifacts = None if uri else (root / "mlartifacts").as_uri()  # a server chooses its own
        self.client = MlflowClient(tracking_uri=uri or f"sqlite:///{root / 'mlflow.db'}")
        self.experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME", "braid")
        self.run_dir = run_dir
        self.run_id = ""

    def where(self) -> dict[str, str]:
        return {"tracking_uri": self.client.tracking_uri, "experiment": self.experiment, "run_id": self.run_id}

    def start(self, run_name: str, params: dict) -> None:
        from mlflow.entities import Param

        found = self.client.get_experiment_by_name(self.experiment)
        experiment = found.experiment_id if found else self.client.create_experiment(
            self.experiment, artifact_location=self.artifacts)
        run = self.client.create_run(experiment, run_name=run_name, tags={"braid.run_dir": str(self.run_dir.resolve())})
        self.run_id = run.info.run_id
        items = [Param(k, str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), _MLFLOW_BATCH):
            self.client.log_batch(self.run_id, params=items[i:i + _MLFLOW_BATCH])

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])

    def finish(self, step: int, summary: dict[str, float], files: list[Path], ok: bool) -> None:
        self.log(step, summary)
        for path in files:
            self.client.log_artifact(self.run_id, str(path), "report")
        self.client.set_terminated(self.run_id, "FINISHED" if ok else "FAILED")


class WandbTracker:
    name = "wandb"

    def __init__(self, run_dir: Path) -> None:
        import wandb

        self.wandb = wandb
        self.run_dir = run_dir
        self.mode = os.environ.get("WANDB_MODE", "offline")
        self.project = os.environ.get("WANDB_PROJECT", "braid")
        self.run = None

    def where(self) -> dict[str, str]:
        return {"dir": str(self.run_dir / "wandb"), "project": self.project, "mode": self.mode,
                "run_id": self.run.id if self.run is not None else ""}

    def start(self, run_name: str, params: dict) -> None:
        config = json.loads((self.run_dir / "config.json").read_text())  # W&B shows nested configs itself
        self.run = self.wandb.init(
            dir=str(self.run_dir), project=self.project, name=run_name, config=config, mode=self.mode,
            reinit="create_new", settings=self.wandb.Settings(silent=True, console="off"),
        )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def finish(self, step: int, summary: dict[str, float], files: list[Path], ok: bool) -> None:
        self.run.log({f"report/{p.stem}": self.wandb.Image(str(p)) for p in files if p.suffix == ".png"}, step=step)
        for path in files:
            if path.suffix == ".md":
                self.run.save(str(path), base_path=str(path.parent), policy="now")
        self.run.summary.update({k.removeprefix("summary/"): v for k, v in summary.items()})
        self.run.finish(exit_code=0 if ok else 1)


TRACKERS = {"tensorboard": TensorBoardTracker, "mlflow": MlflowTracker, "wandb": WandbTracker}
# the package each one imports, for the error when it is missing
PACKAGES = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}
