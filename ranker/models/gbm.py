"""LightGBM over generic text features (kind ``lightgbm``).

Input per prompt (all computed from the raw text, nothing dataset-specific):

1. the hand-designed features of ``ranker.features`` (size, numbers, formulas, enumerated
   choice/step lines and whether they are numeric, vocabulary cues);
2. a stacked text score: TF-IDF (word 1-2-grams) + ridge on the log length, **out of fold** on
   the training set (5 folds, so the trees see honest predictions) and fit on all rows at
   prediction time;
3. ``svd_dims`` latent components of the TF-IDF matrix (truncated SVD: topic/style directions).

Small data (a short generation log): fewer than 200 rows train a fixed 200-round forest with
leaves of at least max(3, n/20) rows instead of early stopping.

Objective: ``regression`` (L2 on the log length, the default) or ``lambdarank`` (the training set
cut into random queries of ``query_size`` prompts, relevance = length decile; scores are mapped
back to a log length by a least-squares line on the training set). Early stopping on a 10%
holdout picks the number of trees; the final model is refit on every row with that count.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ranker.base import Ranker, register
from ranker.features import feature_matrix
from ranker.textvec import TfidfText

_FOLDS = 5


@register("lightgbm")
class LightGBMRanker(Ranker):
    def __init__(self, objective: str = "regression", learning_rate: float = 0.03, num_leaves: int = 15,
                 min_data_in_leaf: int = 30, max_rounds: int = 2000, svd_dims: int = 48,
                 ridge_alpha: float = 1.0, query_size: int = 64, seed: int = 0, threads: int = 0) -> None:
        if objective not in ("regression", "lambdarank"):
            raise ValueError(f"objective must be 'regression' or 'lambdarank', got {objective!r}")
        super().__init__(objective=objective, learning_rate=learning_rate, num_leaves=num_leaves,
                         min_data_in_leaf=min_data_in_leaf, max_rounds=max_rounds, svd_dims=svd_dims,
                         ridge_alpha=ridge_alpha, query_size=query_size, seed=seed, threads=threads)
        self.vec = TfidfText()
        self.ridge_coef, self.ridge_intercept = np.zeros(0), 0.0
        self.svd = np.zeros((0, 0))
        self.booster = None
        self.line = (0.0, 1.0)  # lambdarank score -> log length

    # --- features -------------------------------------------------------------------------
    def _ridge(self, x, y: np.ndarray) -> tuple[np.ndarray, float]:
        from sklearn.linear_model import Ridge

        m = Ridge(alpha=self.params["ridge_alpha"]).fit(x, y)
        return np.asarray(m.coef_, dtype=np.float64), float(m.intercept_)

    def _design(self, prompts: list[str], stacked: np.ndarray | None = None) -> np.ndarray:
        x = self.vec.transform(prompts)
        if stacked is None:
            stacked = np.asarray(x @ self.ridge_coef).ravel() + self.ridge_intercept
        parts = [feature_matrix(prompts), stacked[:, None]]
        if self.svd.size:
            parts.append(np.asarray(x @ self.svd.T))
        return np.hstack(parts)

    def _lgb_params(self, n: int) -> dict:
        p = self.params
        out = {
            "objective": p["objective"], "learning_rate": p["learning_rate"], "num_leaves": p["num_leaves"],
            # small data sets (a short generation log) still need leaves that can split
            "min_data_in_leaf": min(p["min_data_in_leaf"], max(3, n // 20)), "feature_fraction": 0.7,
            "bagging_fraction": 0.8, "bagging_freq": 1, "lambda_l2": 1.0, "verbose": -1, "seed": p["seed"],
            "deterministic": True,
            "num_threads": p["threads"],
        }
        if p["objective"] == "lambdarank":
            out.update(metric="ndcg", eval_at=[max(1, p["query_size"] // 5)], label_gain=list(range(10)))
        return out

    def _dataset(self, x: np.ndarray, y: np.ndarray, rng: np.random.Generator, reference=None):
        import lightgbm as lgb

        if self.params["objective"] == "regression":
            return lgb.Dataset(x, y, reference=reference, free_raw_data=False)
        order = rng.permutation(len(y))  # random queries of query_size prompts, relevance = decile
        x, y = x[order], y[order]
        ranks = np.argsort(np.argsort(y, kind="stable"), kind="stable")
        labels = np.minimum(9, (10 * ranks) // len(y))
        q = self.params["query_size"]
        groups = [q] * (len(y) // q) + ([len(y) % q] if len(y) % q else [])
        return lgb.Dataset(x, labels, group=groups, reference=reference, free_raw_data=False)

    # --- training -------------------------------------------------------------------------
    def _fit(self, prompts: list[str], log_lengths: np.ndarray) -> None:
        import lightgbm as lgb
        from sklearn.decomposition import TruncatedSVD

        n, rng = len(prompts), np.random.default_rng(self.params["seed"])
        x_text = self.vec.fit(prompts).transform(prompts)
        oof = np.full(n, float(np.mean(log_lengths)))
        if n >= 2 * _FOLDS:
            fold = rng.permutation(n) % _FOLDS
            for f in range(_FOLDS):
                coef, icpt = self._ridge(x_text[fold != f], log_lengths[fold != f])
                oof[fold == f] = np.asarray(x_text[fold == f] @ coef).ravel() + icpt
        self.ridge_coef, self.ridge_intercept = self._ridge(x_text, log_lengths)
        dims = min(self.params["svd_dims"], x_text.shape[1] - 1, n - 1)
        self.svd = (TruncatedSVD(dims, random_state=self.params["seed"]).fit(x_text).components_ if dims >= 2
                    else np.zeros((0, 0)))
        x = self._design(prompts, stacked=oof)

        rounds = min(self.params["max_rounds"], 200)  # no holdout to stop on: a short, safe forest
        if n >= 200:  # early stopping on a holdout picks the number of trees
            hold = rng.permutation(n) < max(20, n // 10)
            train_set = self._dataset(x[~hold], log_lengths[~hold], rng)
            valid_set = self._dataset(x[hold], log_lengths[hold], rng, reference=train_set)
            probe = lgb.train(self._lgb_params(n), train_set, num_boost_round=self.params["max_rounds"],
                              valid_sets=[valid_set],
                              callbacks=[lgb.early_stopping(100, verbose=False)])
            rounds = max(20, int(1.1 * (probe.best_iteration or self.params["max_rounds"])))
        self.booster = lgb.train(self._lgb_params(n), self._dataset(x, log_lengths, rng), num_boost_round=rounds)
        if self.params["objective"] == "lambdarank":
            raw = self.booster.predict(x)
            slope, icpt = np.polyfit(raw, log_lengths, 1) if np.std(raw) > 0 else (0.0, float(np.mean(log_lengths)))
            self.line = (float(icpt), float(max(slope, 1e-6)))
        self.train_rounds = rounds

    def _score(self, prompts: list[str]) -> np.ndarray:
        raw = self.booster.predict(self._design(prompts))
        if self.params["objective"] == "lambdarank":
            return self.line[0] + self.line[1] * raw
        return raw

    # --- storage --------------------------------------------------------------------------
    def _save(self, directory: Path) -> None:
        self.vec.save(directory, "tfidf")
        np.save(directory / "ridge_coef.npy", self.ridge_coef)
        np.save(directory / "svd.npy", self.svd)
        self.booster.save_model(str(directory / "lightgbm.txt"))
        (directory / "lightgbm_meta.json").write_text(json.dumps(
            {"ridge_intercept": self.ridge_intercept, "line": list(self.line)}))

    def _load(self, directory: Path) -> None:
        import lightgbm as lgb

        self.vec = TfidfText.load(directory, "tfidf")
        self.ridge_coef = np.load(directory / "ridge_coef.npy")
        self.svd = np.load(directory / "svd.npy")
        if not (directory / "lightgbm.txt").is_file():
            raise FileNotFoundError(directory / "lightgbm.txt")
        self.booster = lgb.Booster(model_file=str(directory / "lightgbm.txt"))
        meta = json.loads((directory / "lightgbm_meta.json").read_text())
        self.ridge_intercept, self.line = float(meta["ridge_intercept"]), tuple(meta["line"])
