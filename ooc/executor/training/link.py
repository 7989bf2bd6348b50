"""Link prediction: decoders, ranking metrics, evaluation from layer-wise embeddings, and
:class:`LinkTrainer`, the :class:`~ooc.executor.training.trainer.Trainer` of
``python -m ooc.train --task link``.

The built-in GNN encodes every node into ``hidden`` channels; a decoder scores a pair
``(s, d)`` from the two embeddings (``dot``: ``h_s . h_d``; ``mlp``: an MLP of
``h_s * h_d``), trained with binary cross-entropy on the
:class:`~ooc.executor.loader.link_loader.LinkLoader`'s batches (every stored edge a
positive, one uniform negative pair per positive). Evaluation computes every node's
embedding by layer-wise inference (:func:`~ooc.executor.inference.layerwise.layerwise_inference`,
out of core within the budget) and scores the dataset's held-out positives against
their stored negatives (:func:`rank_metrics`): AUC (each positive against its own
negatives), MRR and Hits@K (each positive's rank among its negatives, ties counted half
as OGB does).
"""
from __future__ import annotations

import dataclasses
import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import zarr

from ooc.core.errors import InvalidValue
from ooc.executor.inference.layerwise import layerwise_inference
from ooc.executor.inference.store import EmbeddingReader
from ooc.executor.loader.link_loader import LinkLoader, edge_seeds
from ooc.executor.loader.node_loader import GivenPipeline
from ooc.executor.loader.process_budget import process_total
from ooc.executor.training.checkpoint import save_checkpoint
from ooc.executor.training.finite import check_step
from ooc.executor.training.models import build_model
from ooc.executor.training.trainer import Trainer

#: The K of the reported Hits@K.
HITS_AT = (20, 50, 100)
#: Positives scored at a time in evaluation (their rows and their negatives' are read
#: from the embeddings together).
SCORE_ROWS = 1 << 14


class DotDecoder(torch.nn.Module):
    """``score(a, b) = sum(a * b, -1)``: no parameters."""

    kind = "dot"

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a * b).sum(-1)


class MLPDecoder(torch.nn.Module):
    """``score(a, b) = w2 . relu(W1 (a * b) + b1) + b2``."""

    kind = "mlp"

    def __init__(self, dim: int):
        super().__init__()
        self.lin1 = torch.nn.Linear(dim, dim)
        self.lin2 = torch.nn.Linear(dim, 1)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.lin2(F.relu(self.lin1(a * b))).squeeze(-1)


#: ``--decoder`` values.
DECODERS = {"dot": DotDecoder, "mlp": MLPDecoder}


def build_decoder(kind: str, dim: int) -> torch.nn.Module:
    """The decoder ``kind`` (``dot`` or ``mlp``) over ``dim``-channel embeddings."""
    if kind not in DECODERS:
        raise InvalidValue(f"decoder {kind!r}: expected one of {', '.join(DECODERS)}")
    return DotDecoder() if kind == "dot" else MLPDecoder(dim)


def decoder_state(decoder: torch.nn.Module) -> dict[str, Any]:
    """The decoder as plain values (a checkpoint's ``extra``)."""
    return {"kind": decoder.kind,  # type: ignore[attr-defined]
            "state": {k: v.detach().cpu().tolist() for k, v in decoder.state_dict().items()}}


def load_decoder(saved: dict[str, Any], dim: int, where: str = "checkpoint") -> torch.nn.Module:
    """The decoder :func:`decoder_state` saved."""
    try:
        dec = build_decoder(saved["kind"], dim)
        dec.load_state_dict({k: torch.tensor(v) for k, v in saved["state"].items()})
    except (KeyError, TypeError, RuntimeError) as e:
        raise InvalidValue(f"{where}: the link decoder does not load ({e})") from None
    return dec


def rank_metrics(pos: np.ndarray, neg: np.ndarray) -> dict[str, float]:
    """AUC, MRR and Hits@K of positives' scores ``pos`` (float [k]) against their own
    negatives' ``neg`` (float [k, K]); see :class:`RankSums` (the same sums in parts)."""
    sums = RankSums()
    sums.add(pos, neg)
    return sums.result()


class RankSums:
    """Running sums of :func:`rank_metrics` over parts of a split."""

    def __init__(self) -> None:
        self.k = 0
        self.pairs = 0
        self.wins = 0.0
        self.rr = 0.0
        self.hits = dict.fromkeys(HITS_AT, 0)

    def add(self, pos: np.ndarray, neg: np.ndarray) -> None:
        pos = np.asarray(pos, np.float64).reshape(-1, 1)
        neg = np.asarray(neg, np.float64).reshape(pos.shape[0], -1)
        above = (neg > pos).sum(1)
        ties = (neg == pos).sum(1)
        self.wins += float(((neg < pos).sum() + 0.5 * ties.sum()))
        self.pairs += neg.size
        rank = 1 + above + 0.5 * ties  # OGB's: the mean of the optimistic and pessimistic
        self.rr += float((1.0 / rank).sum())
        for h in HITS_AT:
            self.hits[h] += int((rank <= h).sum())
        self.k += pos.shape[0]

    def result(self) -> dict[str, float]:
        if not self.k:
            return {}
        out = {"auc": self.wins / self.pairs, "mrr": self.rr / self.k}
        out.update({f"hits@{h}": self.hits[h] / self.k for h in HITS_AT})
        return out


def _read(reader: EmbeddingReader, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct ``ids`` and their embedding rows (float32)."""
    uniq = np.unique(ids)
    return uniq, np.asarray(reader.read(uniq), dtype=np.float32)


@torch.no_grad()
def score_pairs(out: str | Path, src, dst, decoder: torch.nn.Module | None = None,
                layer: str | None = None) -> np.ndarray:
    """Scores (float32 [k]) of pairs ``(src[i], dst[i])`` from the embeddings ``ooc.infer``
    wrote to ``out`` (its last layer unless ``layer``), by ``decoder`` (default: the dot
    product); ``src``, ``dst`` int node ids of any equal shape."""
    src, dst = np.asarray(src, np.int64), np.asarray(dst, np.int64)
    if src.shape != dst.shape:
        raise InvalidValue(f"score_pairs: src {src.shape} and dst {dst.shape} differ in shape")
    reader = EmbeddingReader(out, layer or last_layer(out))
    decoder = decoder if decoder is not None else DotDecoder()
    res = np.empty(src.shape, np.float32)
    fs, fd, fr = src.reshape(-1), dst.reshape(-1), res.reshape(-1)
    for a in range(0, fs.size, SCORE_ROWS):
        s, d = fs[a:a + SCORE_ROWS], fd[a:a + SCORE_ROWS]
        uniq, rows = _read(reader, np.concatenate([s, d]))
        h = torch.from_numpy(rows)
        fr[a:a + s.size] = decoder(h[np.searchsorted(uniq, s)],
                                   h[np.searchsorted(uniq, d)]).numpy()
    return res


def last_layer(out: str | Path) -> str:
    """The name of the last layer (``hL``) of the finished ``ooc.infer`` output ``out``."""
    names = [k for k in zarr.open_group(str(out), mode="r").array_keys()
             if k.startswith("h") and k[1:].isdigit()]
    if not names:
        raise InvalidValue(f"{out}: no layer arrays (h1 .. hL): pass the --out folder of "
                           f"ooc.infer")
    return max(names, key=lambda k: int(k[1:]))


@torch.no_grad()
def split_metrics(out: str | Path, pos: np.ndarray, neg: np.ndarray,
                  decoder: torch.nn.Module, layer: str | None = None) -> dict[str, float]:
    """:func:`rank_metrics` of the positives ``pos`` (int [2, k]) against their negatives
    ``neg`` (int [k, K]: targets of each positive's source), scored from the embeddings in
    ``out``, :data:`SCORE_ROWS` positives at a time."""
    reader = EmbeddingReader(out, layer or last_layer(out))
    sums = RankSums()
    K = max(1, neg.shape[1])
    step = max(1, SCORE_ROWS // K)
    for a in range(0, pos.shape[1], step):
        s, d = np.asarray(pos[0, a:a + step]), np.asarray(pos[1, a:a + step])
        g = np.asarray(neg[a:a + step])
        uniq, rows = _read(reader, np.concatenate([s, d, g.reshape(-1)]))
        h = torch.from_numpy(rows)
        hs = h[np.searchsorted(uniq, s)]
        ps = decoder(hs, h[np.searchsorted(uniq, d)])
        ns = decoder(hs.unsqueeze(1).expand(-1, g.shape[1], -1), h[np.searchsorted(uniq, g)])
        sums.add(ps.numpy(), ns.numpy())
    return sums.result()


class LinkTrainer(Trainer):
    """Trains the built-in GNN as an encoder and ``config.decoder`` for link prediction on
    the stored adjacency's edges; evaluates on the dataset's link split
    (:attr:`ooc.storage.Dataset.link_split`) from layer-wise embeddings.

    ``model`` (the encoder) is what checkpoints hold as their model (so ``ooc.infer`` on
    one writes the embeddings); the decoder travels in their ``extra``. ``edge_label_index``
    (int [2, m]) trains on these positives instead of every stored edge; ``work_dir``: where
    evaluation writes the embeddings (default: the system's temporary folder)."""

    def __init__(self, dataset, config=None, *, edge_label_index=None,
                 work_dir: str | Path | None = None, **kw):
        self._work_dir = work_dir
        self._positives = edge_label_index
        #: (the weights' versions, the metrics of every part) of the last scoring pass
        self._scored: tuple[tuple[int, ...], dict[str, float]] | None = None
        options = kw.get("options")
        self._budget = getattr(options, "memory_budget", None)
        super().__init__(dataset, config, **kw)

    def _check_dataset(self, dataset, allow_empty_train: bool) -> None:
        if not dataset.num_edges:
            raise InvalidValue(f"{dataset.path}: the dataset has no edges to train on")

    def _build_model(self) -> torch.nn.Module:
        cfg, ds = self.config, self.dataset
        self.decoder = build_decoder(cfg.decoder, cfg.hidden).to(self.device)
        return build_model(cfg.model, ds.feature_dim, cfg.hidden, cfg.hidden, cfg.num_layers,
                           dropout=cfg.dropout, heads=cfg.heads)

    def _parameters(self) -> list[torch.nn.Parameter]:
        if not hasattr(self, "decoder"):  # a model given by the caller
            self.decoder = build_decoder(self.config.decoder, self.config.hidden)
        self.decoder = self.decoder.to(self.device)
        return list(self.model.parameters()) + list(self.decoder.parameters())

    def _edges(self):
        return edge_seeds(self.dataset, self._positives, None, "binary", 1.0,
                          edges_per_epoch=self.config.edges_per_epoch)

    def _train_seeds(self) -> Any:
        return self._edges()

    def _train_loader(self):
        cfg, pipe = self.config, self.train_producer
        return LinkLoader(self.dataset, cfg.fanouts, self._positives, neg_sampling="binary",
                          edges_per_epoch=cfg.edges_per_epoch, batch_size=cfg.batch_size,
                          num_workers=int(getattr(pipe, "workers", 0)), preset=self.preset,
                          seed=cfg.seed, num_threads=cfg.num_threads,
                          source=GivenPipeline(pipe))

    def _step(self, data, epoch: int, step: int, steps: int) -> tuple[float, float, int, int]:
        self.optimizer.zero_grad(set_to_none=True)
        h = self._call(data)[:data.batch_size]
        s, d = data.edge_label_index
        logit = self.decoder(h[s], h[d])
        loss = F.binary_cross_entropy_with_logits(logit, data.edge_label.float())
        v = float(loss.item())
        growth = math.nan
        if math.isfinite(v):
            loss.backward()
            self.optimizer.step()
            growth = float(self._watch.after_step())
        right = int(((logit > 0).float() == data.edge_label).sum())
        check_step(self.dataset.path, epoch, step, steps, v, growth,
                   self.config.max_weight_growth)
        return v, growth, int(logit.shape[0]), right

    # -- evaluation ----------------------------------------------------------------
    def _validate(self) -> dict[str, Any]:
        m = self.link_metrics(("val",))
        return {k: m[k] for k in ("val_auc", "val_mrr") if k in m}

    def embed(self, out: str | Path, **kw: Any) -> dict:
        """Every node's embedding by layer-wise inference into ``out`` (a Zarr group, as
        ``ooc.infer`` writes); its report."""
        self.model.eval()
        try:
            return layerwise_inference(self.dataset, self.model, out,
                                       memory_budget=self._budget or process_total() or None,
                                       progress=bool(self.config.progress), overwrite=True,
                                       **kw)
        finally:
            self.model.train()

    def link_metrics(self, parts=("val", "test")) -> dict[str, float]:
        """``{part}_auc``, ``{part}_mrr``, ``{part}_hits@K`` of the dataset's link split
        (empty when it has none), from every node's embedding computed layer-wise in a
        temporary folder (removed after). Every part is scored from one pass, kept until
        the weights change (the last epoch's validation and the final metrics share it)."""
        self._check_open()
        if self.dataset.link_split is None:
            return {}
        weights = tuple(p._version for p in (*self.model.parameters(),
                                             *self.decoder.parameters()))
        if self._scored is None or self._scored[0] != weights:
            self._scored = (weights, self._score_split())
        return {k: v for k, v in self._scored[1].items() if k.split("_", 1)[0] in parts}

    def _score_split(self) -> dict[str, float]:
        """Every part of the link split scored from embeddings computed now."""
        split = self.dataset.link_split
        assert split is not None
        parts = ("val", "test")
        work = Path(tempfile.mkdtemp(prefix="ooc-link-eval-", dir=self._work_dir))
        try:
            out = work / "emb"
            self.embed(out)
            self.decoder.eval()
            res: dict[str, float] = {}
            for part in parts:
                pos, neg = split.edges(part)
                if pos.shape[1]:
                    m = split_metrics(out, pos, neg, self.decoder.cpu())
                    res.update({f"{part}_{k}": v for k, v in m.items()})
            self.decoder.to(self.device).train()
            return res
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def evaluate(self, ids: np.ndarray) -> float | None:
        raise InvalidValue("LinkTrainer evaluates with link_metrics() (the dataset's link "
                           "split), not on node ids")

    # -- checkpoints -----------------------------------------------------------------
    def save(self, checkpoint_dir: str | Path, args: dict[str, Any] | None = None) -> Path:
        cfg = dataclasses.asdict(self.config)
        return save_checkpoint(checkpoint_dir, self.epoch, self.model, self.optimizer,
                               args=args if args is not None else cfg, history=self.history,
                               extra={"config": cfg, "dataset": str(self.dataset.path),
                                      "num_nodes": self.dataset.num_nodes, "task": "link",
                                      "decoder": decoder_state(self.decoder)},
                               dataset=self.dataset)

    def resume(self, path: str | Path) -> dict[str, Any]:
        state = super().resume(path)
        saved = (state.get("extra") or {}).get("decoder")
        if saved is None:
            raise InvalidValue(f"{path}: not a link-prediction checkpoint (no decoder)")
        self.decoder.load_state_dict(load_decoder(saved, self.config.hidden,
                                                  str(path)).state_dict())
        return state
