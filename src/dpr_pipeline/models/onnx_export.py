"""ONNX copies of a released model (setting `release.export`): ``onnx/model.onnx`` (float32) and
``onnx/model_qint8.onnx`` (int8 weights, dynamic quantization), sentence-transformers' file layout for its
``backend="onnx"`` (``SentenceTransformer`` and ``CrossEncoder`` alike). Each is checked as it is exported against
the PyTorch model on a sample of the dataset (:class:`Check`); one below its format's thresholds stops the job with
:class:`ExportAgreementError` and no file:

* a bi-encoder (:func:`export_biencoder`): its vectors of a sample of queries and passages (mean and lowest
  cosine, and how often a query's top-1 passage among the sampled ones is the same);
* a cross-encoder re-ranker (:func:`export_cross_encoder`): its scores θ(q, d) of a sample of queries, each with
  its top passages of the re-ranker's own run (per query: Spearman's rank correlation of the two models' scores,
  mean and lowest, and whether the top-1 passage is the same; the largest absolute score difference is recorded).

Both kinds share the formats and their thresholds (:data:`FORMATS`), the exporter (:func:`export_graph`), the int8
quantization (:func:`quantize_int8`), the ONNX Runtime session (:class:`OnnxModel`) and the export-check-write loop
(:func:`write_checked_copies`). The graph is PyTorch's ONNX export of the transformer (a bi-encoder's: inputs
``input_ids``, ``attention_mask``, output ``last_hidden_state``; a re-ranker's: the tokenizer's inputs, with
``token_type_ids`` where its model takes them, output ``logits``) and the int8 copy ONNX Runtime's
``quantize_dynamic`` of its MatMul weights (per channel). sentence-transformers' own exporters
(``export_optimized_onnx_model``, ``export_dynamic_quantized_onnx_model``, which take a ``CrossEncoder`` too) need
Optimum (``optimum-onnx``), whose releases require transformers < 4.58, which this project cannot use.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from dpr_pipeline.data.corpus_shards import passage_text
from dpr_pipeline.data.trec_runs import read_trec_run
from dpr_pipeline.errors import DataError, PipelineError
from dpr_pipeline.models.embedding import TextEncoder, load_text_encoder, pool
from dpr_pipeline.models.loading import load_cross_encoder, load_tokenizer
from dpr_pipeline.models.pair_scoring import encode_pairs

log = logging.getLogger(__name__)

#: A bi-encoder's graph inputs (one text: its token types are all 0); a re-ranker's are its tokenizer's.
INPUTS = ("input_ids", "attention_mask")
#: The inputs a re-ranker's graph may take, in this order, where its tokenizer gives them.
PAIR_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
OPSET = 17


@dataclasses.dataclass(frozen=True)
class ExportFormat:
    """One exported copy: its file in the release folder and the agreement with the PyTorch model it must reach
    (``min_mean``, ``min_lowest``: of the per-item figure of the model's :class:`Check`; ``min_top1``: the share of
    queries whose top-1 passage is the same)."""

    name: str
    file: str
    int8: bool
    min_mean: float
    min_lowest: float
    min_top1: float


#: The formats `release.export` may name. float32 ONNX computes what PyTorch computes (cosines 1 - 1e-6 measured on
#: MiniLM); int8 weights move each vector a little (MiniLM on SciFact: mean cosine 0.99, lowest 0.97). A re-ranker's
#: copies meet the same numbers with their per-query Spearman correlation of scores.
FORMATS = {f.name: f for f in (ExportFormat("onnx", "onnx/model.onnx", False, 0.999, 0.99, 0.99),
                               ExportFormat("onnx_int8", "onnx/model_qint8.onnx", True, 0.98, 0.90, 0.85))}
#: The sample an export is checked on: this many queries, each with a passage judged relevant to it where the split
#: has qrels (so that a query's top-1 is a real choice, not a near-tie among strangers), topped up with others.
SAMPLE_QUERIES, SAMPLE_PASSAGES = 32, 64
#: A re-ranker's sample: this many of a query's top passages in the re-ranker's run (the near-ties it decides).
SAMPLE_DEPTH = 8


@dataclasses.dataclass(frozen=True)
class Check:
    """How a model kind's copy is compared with the PyTorch model: the agreement record's keys of the mean and the
    lowest per-item figure (the ``top1_agreement`` key is common), the figure's name, and the sample's."""

    kind: str
    mean: str
    lowest: str
    figure: str
    sample: str         # formatted with the agreement record

    def thresholds(self, fmt: ExportFormat) -> dict:
        return {self.mean: fmt.min_mean, self.lowest: fmt.min_lowest, "top1_agreement": fmt.min_top1}

    def passes(self, fmt: ExportFormat, measured: dict) -> bool:
        return all(measured[key] >= minimum for key, minimum in self.thresholds(fmt).items())

    def describe(self, measured: dict) -> str:
        return (f"mean {self.figure} {measured[self.mean]:.5f}, lowest {measured[self.lowest]:.5f}, top-1 "
                f"agreement {measured['top1_agreement']:.3f}"
                + (f", largest score difference {measured['max_abs_difference']:.2e}"
                   if "max_abs_difference" in measured else ""))


BIENCODER = Check("bi-encoder", "mean_cosine", "min_cosine", "cosine", "{queries} queries and {passages} passages")
CROSS_ENCODER = Check("cross-encoder", "mean_spearman", "min_spearman", "Spearman",
                      "{pairs} (query, passage) pairs of {queries} queries")


class ExportAgreementError(PipelineError, ValueError):
    """An exported copy whose outputs stray from the PyTorch model's beyond its format's thresholds."""

    def __init__(self, model_dir, fmt: ExportFormat, check: Check, agreement: dict):
        self.agreement = agreement
        needed = ", ".join(str(value) for value in check.thresholds(fmt).values())
        super().__init__(
            f"{model_dir}: the {fmt.name} export disagrees with the PyTorch model on "
            f"{check.sample.format(**agreement)} of the dataset ({check.describe(agreement)}; needed {needed}): no "
            f"{fmt.file} was written. Fix: take {fmt.name!r} out of release.export for this model")


def resolve_formats(formats: Sequence[str | ExportFormat]) -> list[ExportFormat]:
    """``formats`` (names in :data:`FORMATS`, or formats) as formats; an unknown name is refused by name."""
    unknown = sorted(f for f in formats if not isinstance(f, ExportFormat) and f not in FORMATS)
    if unknown:
        raise ValueError(f"unknown export format(s) {unknown}; known: {sorted(FORMATS)}")
    return [f if isinstance(f, ExportFormat) else FORMATS[f] for f in formats]


def require_packages() -> None:
    for package in ("onnx", "onnxruntime"):
        if importlib.util.find_spec(package) is None:
            raise PipelineError(f"release.export needs the package {package}, which is not installed where this "
                                "job runs. Fix: pip install -c constraints.txt -e '.[export]'")


class _Hidden(torch.nn.Module):
    """A bi-encoder's transformer as the exported graph sees it: two inputs, the last hidden states out."""

    def __init__(self, transformer: torch.nn.Module):
        super().__init__()
        self.transformer = transformer

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.transformer(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class _Logits(torch.nn.Module):
    """A re-ranker as the exported graph sees it: its tokenizer's inputs (``names``, in order), the logits out."""

    def __init__(self, model: torch.nn.Module, names: Sequence[str]):
        super().__init__()
        self.model, self.names = model, tuple(names)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.model(**dict(zip(self.names, inputs))).logits


def export_graph(module: torch.nn.Module, sample: dict[str, torch.Tensor], output: str, path: Path) -> None:
    """The float32 graph of ``module`` run on ``sample``'s tensors (the graph's inputs, by name and in order) with
    one ``output``, batch and sequence lengths dynamic."""
    path.parent.mkdir(parents=True, exist_ok=True)
    dynamic = {name: {0: "batch", 1: "sequence"} for name in sample}
    dynamic[output] = {0: "batch"} if output == "logits" else {0: "batch", 1: "sequence"}
    with torch.inference_mode(False), torch.no_grad():
        torch.onnx.export(module.eval(), tuple(sample.values()), str(path), dynamo=False, input_names=list(sample),
                          output_names=[output], dynamic_axes=dynamic, opset_version=OPSET)


def quantize_int8(source: Path, target: Path) -> None:
    """ONNX Runtime's dynamic int8 quantization of ``source``'s MatMul weights (per channel; activations
    quantized at run time). The embedding lookups stay float32: quantizing them costs more agreement than size."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8, per_channel=True,
                     op_types_to_quantize=["MatMul"])


class OnnxModel:
    """An exported graph run by ONNX Runtime on the CPU: a batch's tensors that the graph takes in, its one output
    out."""

    def __init__(self, path: Path, threads: int | None = None):
        import onnxruntime as ort

        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.inputs = [graph_input.name for graph_input in self.session.get_inputs()]

    def run(self, batch: dict) -> torch.Tensor:
        return torch.from_numpy(self.session.run(None, {name: batch[name].numpy() for name in self.inputs})[0])


class OnnxEncoder(OnnxModel):
    """A bi-encoder's graph, pooled and normalised as ``encoder`` pools."""

    def __init__(self, path: Path, encoder: TextEncoder, threads: int | None = None):
        super().__init__(path, threads)
        self.pooling = encoder.pooling

    def __call__(self, batch: dict) -> torch.Tensor:
        return F.normalize(pool(self.run(batch), batch["attention_mask"], self.pooling), dim=-1)


class OnnxScorer(OnnxModel):
    """A re-ranker's graph: θ(q, d), its first logit."""

    def __call__(self, batch: dict) -> torch.Tensor:
        return self.run(batch)[:, 0]


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


def score(model, tokenizer, queries: Sequence[str], passages: Sequence[str], max_length: int,
          batch_size: int = 32) -> np.ndarray:
    """θ(queries[i], passages[i]) by ``model``: a re-ranker (PyTorch) or an :class:`OnnxScorer`, the pairs cut as
    the pipeline cuts them (:func:`~dpr_pipeline.models.pair_scoring.encode_pairs`)."""
    rows = []
    for start in range(0, len(queries), batch_size):
        batch = encode_pairs(tokenizer, queries[start:start + batch_size], passages[start:start + batch_size],
                             max_length=max_length)
        with torch.no_grad():
            rows.append(model(batch) if isinstance(model, OnnxScorer) else model(**batch).logits[:, 0])
    return torch.cat(rows).float().numpy()


def agreement(reference: tuple[np.ndarray, np.ndarray], exported: tuple[np.ndarray, np.ndarray]) -> dict:
    """Cosines of each text's two vectors (queries and passages together) and the share of queries whose top-1
    passage among the sampled ones is the same for both models."""
    cosines = np.concatenate([np.sum(a * b, axis=1) for a, b in zip(reference, exported)])
    top1 = [np.argmax(queries @ passages.T, axis=1) for queries, passages in (reference, exported)]
    return {"queries": len(reference[0]), "passages": len(reference[1]), "mean_cosine": float(cosines.mean()),
            "min_cosine": float(cosines.min()), "top1_agreement": float(np.mean(top1[0] == top1[1]))}


def score_agreement(reference: np.ndarray, exported: np.ndarray, sizes: Sequence[int]) -> dict:
    """Two models' scores of the same pairs, ``sizes[i]`` consecutive pairs per query: per query, Spearman's
    correlation of the two (1 where neither model ranks the query's passages apart, 0 where one alone does) and
    whether its top-1 passage is the same; and the largest absolute score difference over all pairs."""
    from scipy.stats import rankdata, spearmanr

    rhos, same = [], []
    for start, size in zip(np.cumsum([0, *sizes[:-1]]), sizes):
        a, b = reference[start:start + size], exported[start:start + size]
        if size < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:     # no correlation defined: the same order or not
            rhos.append(float(np.array_equal(rankdata(a), rankdata(b))))
        else:
            rhos.append(float(spearmanr(a, b).statistic))
        same.append(int(np.argmax(a)) == int(np.argmax(b)))
    return {"queries": len(sizes), "pairs": int(sum(sizes)), "mean_spearman": float(np.mean(rhos)),
            "min_spearman": float(np.min(rhos)), "top1_agreement": float(np.mean(same)),
            "max_abs_difference": float(np.max(np.abs(reference - exported)))}


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


def sample_pairs(run_path: str | Path, queries_path: str | Path, corpus_path: str | Path, *,
                 queries: int = SAMPLE_QUERIES, depth: int = SAMPLE_DEPTH, seed: int = 0
                 ) -> list[tuple[str, list[str]]]:
    """A seeded sample of a re-ranker's run (``run_path``, a TREC run of the split whose queries artifact is
    ``queries_path``): ``queries`` of its queries, each with the texts (``title text``) of its top ``depth``
    passages in the run, as ``[(query, [passage, …])]``."""
    import pandas as pd

    run = read_trec_run(run_path)
    run = run[run.groupby("query_id", sort=False).cumcount() < depth]
    texts = pd.read_parquet(queries_path).set_index("query_id")["text"]
    corpus = pd.read_parquet(corpus_path).set_index("doc_id")
    for column, known, what in (("query_id", texts.index, queries_path), ("doc_id", corpus.index, corpus_path)):
        missing = run.loc[~run[column].isin(known), column]
        if len(missing):
            raise DataError(run_path, f"{column} {missing.iat[0]!r} is not in {what}",
                            "check the re-ranker's release against a run of the same dataset and split")
    ids = run["query_id"].unique()
    picked = ids[np.sort(np.random.default_rng(seed).permutation(len(ids))[:queries])]
    sample = []
    for query_id in picked:
        rows = corpus.loc[run.loc[run["query_id"] == query_id, "doc_id"]]
        sample.append((texts[query_id], [passage_text(t, x) for t, x in zip(rows["title"], rows["text"])]))
    return sample


def write_checked_copies(model_dir: str | Path, output_dir: str | Path, formats: Sequence[str | ExportFormat],
                         check: Check, export: Callable[[Path], None], measure: Callable[[Path], dict]) -> dict:
    """Each of ``formats`` of the model in ``model_dir`` written into ``output_dir`` once it agrees with the
    PyTorch model: ``export`` writes the float32 graph to the path it is given (int8 copies are quantized from it),
    ``measure`` compares a graph's outputs with the PyTorch model's on the sample (the agreement record ``check``
    reads). Returns ``{format: {file, bytes, agreement…, thresholds}}``; a copy that falls short raises
    :class:`ExportAgreementError` before anything of it is written."""
    formats = resolve_formats(formats)
    require_packages()
    report = {}
    with tempfile.TemporaryDirectory(prefix="onnx-export-") as tmp:
        fp32 = Path(tmp) / "model.onnx"
        export(fp32)
        for fmt in formats:
            path = fp32
            if fmt.int8:
                path = Path(tmp) / "model_qint8.onnx"
                quantize_int8(fp32, path)
            measured = measure(path)
            if not check.passes(fmt, measured):
                raise ExportAgreementError(model_dir, fmt, check, measured)
            target = Path(output_dir) / fmt.file
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            report[fmt.name] = {"file": fmt.file, "bytes": target.stat().st_size, **measured,
                                "thresholds": check.thresholds(fmt)}
            log.info("%s export of %s (%s): %s (%.1f MB); against PyTorch on %s: %s", fmt.name, model_dir,
                     check.kind, fmt.file, target.stat().st_size / 1e6, check.sample.format(**measured),
                     check.describe(measured))
    return report


def export_biencoder(model_dir: str | Path, output_dir: str | Path, formats: Sequence[str | ExportFormat],
                     queries: Sequence[str], passages: Sequence[str], *, max_length: int | None = None,
                     threads: int | None = None) -> dict:
    """Write each of ``formats`` (names in :data:`FORMATS`, or formats) of the bi-encoder in ``model_dir`` into
    ``output_dir`` once it agrees with the PyTorch model on ``queries`` and ``passages`` (each with the model's
    prompt, cut at ``max_length`` tokens: the tokenizer's own length when None); :func:`write_checked_copies`."""
    resolve_formats(formats)
    encoder = load_text_encoder(str(model_dir)).eval()
    tokenizer = load_tokenizer(str(model_dir))
    length = max_length or min(tokenizer.model_max_length, 512)
    prompts = encoder.prompts

    def vectors(model) -> tuple[np.ndarray, np.ndarray]:
        return (embed(model, tokenizer, queries, prompts.query, length),
                embed(model, tokenizer, passages, prompts.passage, length))

    reference = vectors(encoder)
    sample = tokenizer(["a query", "a longer passage of a few more words"], padding=True, return_tensors="pt")
    return write_checked_copies(
        model_dir, output_dir, formats, BIENCODER,
        lambda path: export_graph(_Hidden(encoder.transformer), {name: sample[name] for name in INPUTS},
                                  "last_hidden_state", path),
        lambda path: agreement(reference, vectors(OnnxEncoder(path, encoder, threads))))


def export_cross_encoder(model_dir: str | Path, output_dir: str | Path, formats: Sequence[str | ExportFormat],
                         sample: Sequence[tuple[str, Sequence[str]]], *, max_length: int | None = None,
                         threads: int | None = None) -> dict:
    """Write each of ``formats`` of the re-ranker in ``model_dir`` into ``output_dir`` once its scores agree with
    the PyTorch model's on ``sample`` (:func:`sample_pairs`: queries, each with its passages; pairs cut at
    ``max_length`` tokens, the tokenizer's own length when None); :func:`write_checked_copies`."""
    resolve_formats(formats)
    model = load_cross_encoder(str(model_dir)).eval()
    tokenizer = load_tokenizer(str(model_dir))
    length = max_length or min(tokenizer.model_max_length, 512)
    queries = [query for query, passages in sample for _ in passages]
    passages = [passage for _, group in sample for passage in group]
    sizes = [len(group) for _, group in sample]
    reference = score(model, tokenizer, queries, passages, length)
    example = encode_pairs(tokenizer, ["a query", "a longer query of words"],
                           ["a passage of a few more words", "a passage"], max_length=length)
    names = [name for name in PAIR_INPUTS if name in example]
    return write_checked_copies(
        model_dir, output_dir, formats, CROSS_ENCODER,
        lambda path: export_graph(_Logits(model, names), {name: example[name] for name in names}, "logits", path),
        lambda path: score_agreement(reference, score(OnnxScorer(path, threads), tokenizer, queries, passages,
                                                      length), sizes))


def export_section(report: dict, cross_encoder: bool = False) -> str:
    """The release card's section on its exported copies: file, size and agreement with the PyTorch model."""
    if cross_encoder:
        intro = ("Checked at export against the PyTorch model's scores θ(q, d) on a sample of the dataset's queries, "
                 "each with its top passages in this re-ranker's run (per query: Spearman's correlation of the two "
                 "models' scores and whether the top-1 passage is the same; the largest score difference over all "
                 "pairs). Load with `CrossEncoder(folder, backend=\"onnx\", model_kwargs={\"file_name\": FILE})` "
                 "(needs `sentence-transformers[onnx]`) or ONNX Runtime (the tokenizer's inputs of a pair; output "
                 "`logits`, θ(q, d) its first column).")
        header = ("| format | file | size | queries | pairs | mean Spearman | lowest Spearman | top-1 agreement | "
                  "largest score difference |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        rows = [f"| {name} | `{row['file']}` | {row['bytes'] / 1e6:.1f} MB | {row['queries']} | {row['pairs']} | "
                f"{row['mean_spearman']:.5f} | {row['min_spearman']:.5f} | {row['top1_agreement']:.3f} | "
                f"{row['max_abs_difference']:.2e} |" for name, row in report.items()]
    else:
        intro = ("Checked at export against the PyTorch model on a sample of the dataset's queries and passages (the "
                 "cosine of each text's two vectors; top-1: a query's best passage among the sampled ones is the "
                 "same). Load with `SentenceTransformer(folder, backend=\"onnx\", model_kwargs={\"file_name\": FILE})` "
                 "(needs `sentence-transformers[onnx]`) or ONNX Runtime (inputs `input_ids`, `attention_mask`; output "
                 "`last_hidden_state`, pooled as this model pools).")
        header = ("| format | file | size | queries | passages | mean cosine | lowest cosine | top-1 agreement |\n"
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        rows = [f"| {name} | `{row['file']}` | {row['bytes'] / 1e6:.1f} MB | {row['queries']} | {row['passages']} | "
                f"{row['mean_cosine']:.5f} | {row['min_cosine']:.5f} | {row['top1_agreement']:.3f} |"
                for name, row in report.items()]
    return "\n".join(["## ONNX exports", "", intro, "", header, *rows]) + "\n"
