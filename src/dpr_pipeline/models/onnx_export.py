"""ONNX copies of a released bi-encoder (setting `release.export`): ``onnx/model.onnx`` (float32) and
``onnx/model_qint8.onnx`` (int8 weights, dynamic quantization), sentence-transformers' file layout for its
``backend="onnx"``. Each is checked as it is exported: its vectors against the PyTorch model's on a sample of the
dataset's queries and passages (mean and lowest cosine, and how often a query's top-1 passage among the sampled ones
is the same); one below its format's thresholds stops the job with :class:`ExportAgreementError` and no file.

The graph is PyTorch's ONNX export of the transformer (inputs ``input_ids``, ``attention_mask``; output
``last_hidden_state``) and the int8 copy ONNX Runtime's ``quantize_dynamic`` of its MatMul weights (per channel).
sentence-transformers' own exporters (``export_optimized_onnx_model``, ``export_dynamic_quantized_onnx_model``) need
Optimum (``optimum-onnx``), whose releases require transformers < 4.58, which this project cannot use.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from dpr_pipeline.data.corpus_shards import passage_text
from dpr_pipeline.errors import PipelineError
from dpr_pipeline.models.embedding import TextEncoder, load_text_encoder, pool
from dpr_pipeline.models.loading import load_tokenizer

log = logging.getLogger(__name__)

INPUTS = ("input_ids", "attention_mask")
OPSET = 17


@dataclasses.dataclass(frozen=True)
class ExportFormat:
    """One exported copy: its file in the release folder and the agreement with the PyTorch model it must reach."""

    name: str
    file: str
    int8: bool
    min_mean_cosine: float
    min_cosine: float
    min_top1_agreement: float


#: The formats `release.export` may name. float32 ONNX computes what PyTorch computes (cosines 1 - 1e-6 measured on
#: MiniLM); int8 weights move each vector a little (MiniLM on SciFact: mean cosine 0.99, lowest 0.97).
FORMATS = {f.name: f for f in (ExportFormat("onnx", "onnx/model.onnx", False, 0.999, 0.99, 0.99),
                               ExportFormat("onnx_int8", "onnx/model_qint8.onnx", True, 0.98, 0.90, 0.85))}
#: The sample an export is checked on: this many queries, each with a passage judged relevant to it where the split
#: has qrels (so that a query's top-1 is a real choice, not a near-tie among strangers), topped up with others.
SAMPLE_QUERIES, SAMPLE_PASSAGES = 32, 64


class ExportAgreementError(PipelineError, ValueError):
    """An exported copy whose vectors stray from the PyTorch model's beyond its format's thresholds."""

    def __init__(self, model_dir, fmt: ExportFormat, agreement: dict):
        self.agreement = agreement
        super().__init__(
            f"{model_dir}: the {fmt.name} export disagrees with the PyTorch model on {agreement['queries']} queries "
            f"and {agreement['passages']} passages of the dataset (mean cosine {agreement['mean_cosine']:.4f}, "
            f"lowest {agreement['min_cosine']:.4f}, top-1 agreement {agreement['top1_agreement']:.3f}; needed "
            f"{fmt.min_mean_cosine}, {fmt.min_cosine}, {fmt.min_top1_agreement}): no {fmt.file} was written. Fix: "
            f"take {fmt.name!r} out of release.export for this model")


class _Hidden(torch.nn.Module):
    """The transformer as the exported graph sees it: two inputs, the last hidden states out."""

    def __init__(self, transformer: torch.nn.Module):
        super().__init__()
        self.transformer = transformer

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.transformer(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def export_graph(encoder: TextEncoder, tokenizer, path: Path) -> None:
    """The float32 graph of ``encoder``'s transformer, batch and sequence lengths dynamic."""
    sample = tokenizer(["a query", "a longer passage of a few more words"], padding=True, return_tensors="pt")
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.inference_mode(False), torch.no_grad():
        torch.onnx.export(_Hidden(encoder.transformer).eval(), tuple(sample[name] for name in INPUTS), str(path),
                          dynamo=False, input_names=list(INPUTS), output_names=["last_hidden_state"],
                          dynamic_axes={name: {0: "batch", 1: "sequence"}
                                        for name in (*INPUTS, "last_hidden_state")}, opset_version=OPSET)


def quantize_int8(source: Path, target: Path) -> None:
    """ONNX Runtime's dynamic int8 quantization of ``source``'s MatMul weights (per channel; activations
    quantized at run time). The embedding lookups stay float32: quantizing them costs more agreement than size."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8, per_channel=True,
                     op_types_to_quantize=["MatMul"])


class OnnxEncoder:
    """An exported graph run by ONNX Runtime on the CPU, pooled and normalised as ``encoder`` pools."""

    def __init__(self, path: Path, encoder: TextEncoder, threads: int | None = None):
        import onnxruntime as ort

        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.pooling = encoder.pooling

    def __call__(self, batch: dict) -> torch.Tensor:
        hidden = self.session.run(None, {name: batch[name].numpy() for name in INPUTS})[0]
        return F.normalize(pool(torch.from_numpy(hidden), batch["attention_mask"], self.pooling), dim=-1)


def embed(model, tokenizer, texts: Sequence[str], prompt: str, max_length: int, batch_size: int = 32) -> np.ndarray:
    """``texts`` (``prompt`` before each) embedded by ``model``: a :class:`TextEncoder` or an :class:`OnnxEncoder`."""
    rows = []
    for start in range(0, len(texts), batch_size):
        batch = tokenizer([prompt + text for text in texts[start:start + batch_size]], padding=True, truncation=True,
                          max_length=max_length, return_tensors="pt")
        with torch.no_grad():
            rows.append(model(batch) if isinstance(model, OnnxEncoder) else
                        model(batch["input_ids"], batch["attention_mask"]))
    return torch.cat(rows).float().numpy()


def agreement(reference: tuple[np.ndarray, np.ndarray], exported: tuple[np.ndarray, np.ndarray]) -> dict:
    """Cosines of each text's two vectors (queries and passages together) and the share of queries whose top-1
    passage among the sampled ones is the same for both models."""
    cosines = np.concatenate([np.sum(a * b, axis=1) for a, b in zip(reference, exported)])
    top1 = [np.argmax(queries @ passages.T, axis=1) for queries, passages in (reference, exported)]
    return {"queries": len(reference[0]), "passages": len(reference[1]), "mean_cosine": float(cosines.mean()),
            "min_cosine": float(cosines.min()), "top1_agreement": float(np.mean(top1[0] == top1[1]))}


def sample_texts(queries_path: str | Path, corpus_path: str | Path, qrels_path: str | Path | None = None, *,
                 queries: int = SAMPLE_QUERIES, passages: int = SAMPLE_PASSAGES, seed: int = 0
                 ) -> tuple[list[str], list[str]]:
    """A seeded sample of a split's query texts and the corpus's passage texts (``title text``): the queries'
    relevant passages first (one each, where ``qrels_path`` is given), then others."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    table = pd.read_parquet(queries_path)
    picked = table.iloc[np.sort(rng.permutation(len(table))[:queries])]
    corpus = pd.read_parquet(corpus_path).set_index("doc_id")
    doc_ids: list[str] = []
    if qrels_path is not None:
        qrels = pd.read_parquet(qrels_path)
        relevant = qrels[(qrels["relevance"] > 0) & qrels["query_id"].isin(picked["query_id"])]
        doc_ids = [d for d in relevant.drop_duplicates("query_id")["doc_id"] if d in corpus.index][:passages]
    others = [d for d in corpus.index[rng.permutation(len(corpus))[:passages]] if d not in set(doc_ids)]
    doc_ids += others[:passages - len(doc_ids)]
    rows = corpus.loc[doc_ids]
    return list(picked["text"]), [passage_text(t, x) for t, x in zip(rows["title"], rows["text"])]


def export_biencoder(model_dir: str | Path, output_dir: str | Path, formats: Sequence[str | ExportFormat],
                     queries: Sequence[str],
                     passages: Sequence[str], *, max_length: int | None = None, threads: int | None = None) -> dict:
    """Write each of ``formats`` (names in :data:`FORMATS`, or formats) of the bi-encoder in ``model_dir`` into
    ``output_dir`` once it
    agrees with the PyTorch model on ``queries`` and ``passages`` (each with the model's prompt, cut at
    ``max_length`` tokens: the tokenizer's own length when None). Returns ``{format: {file, agreement…}}``; a copy
    that falls short raises :class:`ExportAgreementError` before anything of it is written."""
    unknown = sorted(f for f in formats if not isinstance(f, ExportFormat) and f not in FORMATS)
    if unknown:
        raise ValueError(f"unknown export format(s) {unknown}; known: {sorted(FORMATS)}")
    for package in ("onnx", "onnxruntime"):
        if importlib.util.find_spec(package) is None:
            raise PipelineError(f"release.export needs the package {package}, which is not installed where this "
                                "job runs. Fix: pip install -c constraints.txt -e '.[export]'")
    encoder = load_text_encoder(str(model_dir)).eval()
    tokenizer = load_tokenizer(str(model_dir))
    length = max_length or min(tokenizer.model_max_length, 512)
    prompts = encoder.prompts

    def vectors(model) -> tuple[np.ndarray, np.ndarray]:
        return (embed(model, tokenizer, queries, prompts.query, length),
                embed(model, tokenizer, passages, prompts.passage, length))

    reference = vectors(encoder)
    report = {}
    with tempfile.TemporaryDirectory(prefix="onnx-export-") as tmp:
        fp32 = Path(tmp) / "model.onnx"
        export_graph(encoder, tokenizer, fp32)
        for fmt in formats:
            fmt = fmt if isinstance(fmt, ExportFormat) else FORMATS[fmt]
            name, path = fmt.name, fp32
            if fmt.int8:
                path = Path(tmp) / "model_qint8.onnx"
                quantize_int8(fp32, path)
            measured = agreement(reference, vectors(OnnxEncoder(path, encoder, threads)))
            if (measured["mean_cosine"] < fmt.min_mean_cosine or measured["min_cosine"] < fmt.min_cosine
                    or measured["top1_agreement"] < fmt.min_top1_agreement):
                raise ExportAgreementError(model_dir, fmt, measured)
            target = Path(output_dir) / fmt.file
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            report[name] = {"file": fmt.file, "bytes": target.stat().st_size, **measured,
                            "thresholds": {"mean_cosine": fmt.min_mean_cosine, "min_cosine": fmt.min_cosine,
                                           "top1_agreement": fmt.min_top1_agreement}}
            log.info("%s export of %s: %s (%.1f MB); against PyTorch on %d queries and %d passages: mean cosine "
                     "%.5f, lowest %.5f, top-1 agreement %.3f", name, model_dir, fmt.file, target.stat().st_size / 1e6,
                     measured["queries"], measured["passages"], measured["mean_cosine"], measured["min_cosine"],
                     measured["top1_agreement"])
    return report


def export_section(report: dict) -> str:
    """The release card's section on its exported copies: file, size and agreement with the PyTorch model."""
    lines = ["## ONNX exports", "",
             "Checked at export against the PyTorch model on a sample of the dataset's queries and passages (the "
             "cosine of each text's two vectors; top-1: a query's best passage among the sampled ones is the same). "
             "Load with `SentenceTransformer(folder, backend=\"onnx\", model_kwargs={\"file_name\": FILE})` "
             "(needs `sentence-transformers[onnx]`) or ONNX Runtime (inputs `input_ids`, `attention_mask`; output "
             "`last_hidden_state`, pooled as this model pools).", "",
             "| format | file | size | queries | passages | mean cosine | lowest cosine | top-1 agreement |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, row in report.items():
        lines.append(f"| {name} | `{row['file']}` | {row['bytes'] / 1e6:.1f} MB | {row['queries']} | "
                     f"{row['passages']} | {row['mean_cosine']:.5f} | {row['min_cosine']:.5f} | "
                     f"{row['top1_agreement']:.3f} |")
    return "\n".join(lines) + "\n"
