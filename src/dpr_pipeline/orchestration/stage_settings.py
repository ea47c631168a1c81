"""The parameters each job gets, one function per stage, from the validated config, the dataset and the job's
wildcards (stage, method, split, target B of a transfer).

Each starts from :func:`dpr_pipeline.orchestration.config.stage_params` (the top-level stage values merged with the dataset's
overrides) and resolves what depends on the job: the model a bi-encoder starts from, the corpus side of a transfer,
how deep a run is searched. A model named by a Hugging Face Hub name becomes the folder it is fetched into
(:func:`dpr_pipeline.models.hub_fetch.model_source`): no job gets a Hub name. Rules call them through ``settings`` in
``rules/common.smk``; no rule or input function
reads the config's stage blocks itself. A key one of them turns into something else (Retriever2's start, the
fusion weight, the pairs the teacher scores) is read there only and kept out of its block's jobs' params
(:func:`resolves`). Which keys of the merged values a job gets, the job's settings class says (its fields:
:meth:`~dpr_pipeline.job_settings.JobSettings.pick`); its adapter builds that class from them.
"""

from __future__ import annotations

from dpr_pipeline.data.dev_split import dev_split_of
from dpr_pipeline.data.pseudo_queries import PseudoQuerySettings
from dpr_pipeline.models.hub_fetch import model_source
from dpr_pipeline.models.settings import StartingModelSettings
from dpr_pipeline.pretraining.methods import RANDOM_GENERATOR
from dpr_pipeline.pretraining.settings import NgramCountSettings, PretrainSettings, TokenizeCorpusSettings
from dpr_pipeline.reranking.settings import DenoiseScoringSettings, RerankSettings, TeacherScoreSettings
from dpr_pipeline.reranking.score_fusion import weight_setting
from dpr_pipeline.retrieval.negative_filters import FILTER_KEYS as NEGATIVE_FILTERS
from dpr_pipeline.retrieval.settings import DenseIndexSettings, DenseSearchSettings, EncodeCorpusSettings
from dpr_pipeline.training.schedule import STEP_KEYS
from dpr_pipeline.training.settings import RerankerSettings
from dpr_pipeline.orchestration.config import stage_params
from dpr_pipeline.layout import PRETRAINING_START, TEACHER_SCORES, model_dir, stage_file
from dpr_pipeline.stages import (
    ABLATION,
    BIENCODER,
    PRETRAINING,
    STAGE_LABELS,
    blocks,
    denoisers,
    family_member,
    member,
    settings_class,
    starting_stage,
    trained,
)
from dpr_pipeline.stages import stage as declared


def bm25(config: dict, dataset: str) -> dict:
    """Pyserini's index and search settings (`bm25`)."""
    return stage_params(config, dataset, "bm25")


#: Keys a settings function here resolves itself, by block (each function says which, :func:`resolves`): kept out
#: of the block's jobs' params (:func:`job_params`), so that a release adding one retrains nothing.
RESOLVED_HERE: dict[str, tuple[str, ...]] = {}


def resolves(block: str, *keys: str):
    """Marks the settings function that reads ``keys`` of ``block`` and hands the jobs what they stand for: the
    keys join :data:`RESOLVED_HERE`, and no other function hands them on."""

    def mark(function):
        RESOLVED_HERE[block] = RESOLVED_HERE.get(block, ()) + keys
        return function

    return mark


# Keys a job gets only when set (not null): left at null they change nothing, and a release adding one reruns
# nothing. The bi-encoders' prompts: null takes the model's own (embedding.resolve_prompts).
ONLY_WHEN_SET = ("query_prompt", "passage_prompt")


def job_params(config: dict, dataset: str, block: str) -> dict:
    """A config block's values (:func:`dpr_pipeline.orchestration.config.stage_params`) as its jobs get them: without the
    keys
    resolved here (``RESOLVED_HERE``), nor those of ``ONLY_WHEN_SET`` left at null."""
    return {key: value for key, value in stage_params(config, dataset, block).items()
            if key not in RESOLVED_HERE.get(block, ()) and not (key in ONLY_WHEN_SET and value is None)}


@resolves("pretrain", "reinitialize_layers", "reinitialize_seed")
def pretrain(config: dict, dataset: str, method: str | None = None) -> dict:
    """Pre-training settings (`pretrain`), ``plm`` and ``generator`` as the jobs load them (``plm``: the
    :func:`pretraining_start` folder where ``reinitialize_layers`` is set); ``method``: the one a
    ``pretrain/{method}`` job trains, not ``pretrain.method`` (the one the main chain starts from), and then only
    the keys that job reads (:class:`~dpr_pipeline.pretraining.settings.PretrainSettings`)."""
    params = job_params(config, dataset, "pretrain")
    start = pretraining_start(config, dataset)
    generator = params["generator"]
    params = {**params, "plm": start["model"] if start else model_source(config, params["plm"]),
              "generator": generator if generator == RANDOM_GENERATOR else model_source(config, generator)}
    if method is None:
        return params
    return PretrainSettings.pick({**params, "method": method})


def tokenize_corpus(config: dict, dataset: str) -> dict:
    """What a tokenisation job reads (:class:`~dpr_pipeline.pretraining.settings.TokenizeCorpusSettings`)."""
    return TokenizeCorpusSettings.pick(pretrain(config, dataset))


def count_ngrams(config: dict, dataset: str) -> dict:
    """What the n-gram counting job reads (:class:`~dpr_pipeline.pretraining.settings.NgramCountSettings`)."""
    return NgramCountSettings.pick(pretrain(config, dataset))


def pretraining_start(config: dict, dataset: str) -> dict | None:
    """What the ``pretraining_start`` job draws, where ``pretrain.reinitialize_layers`` is set (else None): the
    plm (as loaded), how many of its top layers, the draw's seed, the folder it writes (``model``) and that
    folder's passage length (Retriever₁'s, which the ablation's ``none`` row trains at)."""
    params = stage_params(config, dataset, "pretrain")
    if not params.get("reinitialize_layers"):  # absent from a manifest's config written before the setting
        return None
    return {"plm": model_source(config, params["plm"]), "layers": params["reinitialize_layers"],
            "seed": params["reinitialize_seed"], "model": stage_file(PRETRAINING_START, "model", dataset),
            "max_length": stage_params(config, dataset, "retriever")["passage_max_length"]}


def pretrained_model(dataset: str, method: str) -> str:
    """The encoder the ``pretrain`` job of ``method`` writes."""
    return stage_file(member(PRETRAINING, method), "model", dataset)


def initialisation(config: dict, dataset: str, stage: str) -> str:
    """The model a bi-encoder stage starts from: its declared block's ``plm`` (``retriever`` for the starting
    model, ``retriever1``/``retriever2`` over it, ``distill``: :mod:`dpr_pipeline.stages`), where
    ``pretrain`` means this dataset's ``pretrain.method`` output and a trained stage the stage declares in
    ``starts_from`` (``retriever2.plm: retriever1``, ``distill.plm: retriever2``) that stage's model on this
    dataset; ``ablation/{method}`` starts from that method's output (``none``: the plm that pre-training starts
    from)."""
    family, method = family_member(stage) or (None, None)
    if family is ABLATION:
        return pretrain(config, dataset)["plm"] if method == "none" else pretrained_model(dataset, method)
    plm = stage_params(config, dataset, declared(stage).block)["plm"]
    if plm == "pretrain":
        return pretrained_model(dataset, pretrain(config, dataset)["method"])
    if plm in declared(stage).starts_from:
        return stage_file(plm, "model", dataset)
    return model_source(config, plm)


def bi_encoder_block(config: dict, dataset: str, stage: str) -> dict:
    """A bi-encoder stage's declared block (:func:`job_params`), ``plm`` resolved to the model it starts from."""
    return {**job_params(config, dataset, declared(stage).block), "plm": initialisation(config, dataset, stage)}


def biencoder(config: dict, dataset: str, stage: str) -> dict:
    """A trained bi-encoder stage's training job's params: the keys of its settings class
    (:func:`dpr_pipeline.stages.settings_class`) from :func:`bi_encoder_block`."""
    return settings_class(stage).pick(bi_encoder_block(config, dataset, stage))


def starting_model(config: dict, dataset: str) -> dict:
    """What the ``starting_model`` job reads (:class:`~dpr_pipeline.models.settings.StartingModelSettings`), ``plm``
    as loaded."""
    return StartingModelSettings.pick(bi_encoder_block(config, dataset, starting_stage()))


def encode_corpus(config: dict, dataset: str, stage: str, target: str | None = None) -> dict:
    """What a corpus encoding job reads (:class:`~dpr_pipeline.retrieval.settings.EncodeCorpusSettings`):
    ``stage``'s passage length (a transfer's: target B's, None for the model's own) and bf16, and the corpus
    side's settings (:func:`encoding`; target B's shards in a transfer)."""
    return EncodeCorpusSettings.pick(_encoding_values(config, dataset, stage, target, "passage"))


def dense_index(config: dict, dataset: str, target: str | None = None) -> dict:
    """What an index job reads (:class:`~dpr_pipeline.retrieval.settings.DenseIndexSettings`, :func:`encoding`)."""
    return DenseIndexSettings.pick(encoding(config, dataset, target))


def dense_search(config: dict, dataset: str, stage: str, target: str | None = None) -> dict:
    """What a dense search job reads (:class:`~dpr_pipeline.retrieval.settings.DenseSearchSettings`): ``stage``'s
    query length (a transfer's: target B's, None for the model's own) and bf16, and the corpus side's settings;
    its depth: :func:`search_depth`."""
    return DenseSearchSettings.pick(_encoding_values(config, dataset, stage, target, "query"))


def _encoding_values(config: dict, dataset: str, stage: str, target: str | None, side: str) -> dict:
    """The corpus side's settings (:func:`encoding`) with ``stage``'s ``<side>_max_length`` (target B's
    ``transfer_max_length[side]`` in a transfer) and bf16."""
    corpus = encoding(config, dataset, target)
    stage_side = bi_encoder_block(config, dataset, stage)
    length = corpus["transfer_max_length"][side] if target else stage_side[f"{side}_max_length"]
    return {**corpus, f"{side}_max_length": length, "bf16": stage_side["bf16"]}


def selection(config: dict, dataset: str, stage: str) -> dict:
    """How a trained bi-encoder stage chooses on the dev split between its trained model and its start
    (`selection`, :mod:`dpr_pipeline.training.dev_selection`): ``split`` (the dataset's dev split), ``metric`` at its
    ``relevance_level``, searched as the stage's dev search is (``depth``, the encoding batch size, the vectors'
    ``embedding_dtype``, ``ignore_identical_ids``), the stage's ``label`` and its start's (``start_label``;
    ``start_stage``: the chain stage whose model it starts from, ``start`` for the bi-encoders' starting model,
    else None; its dev run is the start's score). ``split`` is None
    and ``reason`` says why where the trained model goes on unchecked: `selection.dev` false, no dev split, a
    dataset judged by answers, or an ablation stage (it measures its pre-training method, so it keeps its model)."""
    params = stage_params(config, dataset, "selection")
    collection = config["datasets"][dataset]
    dev = dev_split_of(collection)
    start = initialisation(config, dataset, stage)
    start_stage = starting_stage() if start == initialisation(config, dataset, starting_stage()) else \
        next((name for name in trained() if start == stage_file(name, "model", dataset)), None)
    start_label = STAGE_LABELS[start_stage] if start_stage else start
    reason = ("stages.selection.dev is false" if not params["dev"] else
              "an ablation stage measures its pre-training method and keeps its trained model"
              if declared(stage) is ABLATION else
              "the dataset has no dev_split" if dev is None else
              "the dataset judges relevance by answers; the choice needs qrels"
              if collection.get("relevance") == "answers" else None)
    corpus = encoding(config, dataset)
    return {"split": None if reason else dev.name, "reason": reason, "metric": params["metric"],
            "depth": search_depth(config, dataset, stage, dev.name) if dev else corpus["search_depth"],
            "relevance_level": collection.get("metric_relevance", {}).get(dev.name, 1) if dev else 1,
            "encode_batch_size": corpus["encode_batch_size"], "embedding_dtype": corpus["embedding_dtype"],
            "ignore_identical_ids": bool(collection.get("ignore_identical_ids", False)),
            "label": STAGE_LABELS.get(stage, stage), "start_label": start_label, "start_stage": start_stage,
            **teacher_check(stage, start_stage, reason)}


def teacher_check(stage: str, start_stage: str | None, reason: str | None) -> dict:
    """A distilled stage's teacher (``teacher_stage``, ``teacher_label``), whose dev score must be above the
    student's start's for the student to be trained; nothing where there is no teacher, no dev check or no chain
    stage to start from (a model outside the chain has no dev score)."""
    teacher = declared(stage).teacher if family_member(stage) is None else None
    if teacher is None or start_stage is None or reason is not None:
        return {}
    return {"teacher_stage": teacher, "teacher_label": STAGE_LABELS[teacher]}


# What a transfer job takes from target B rather than from A: B's corpus decides these, and B's
# `transfer_max_length` the lengths its queries and passages are encoded at (:func:`transfer_max_length`).
CORPUS_SIDE = ("encode_shards", "index", "search_depth")


def encoding(config: dict, dataset: str, target: str | None = None) -> dict:
    """Corpus encoding, index and search settings, shared by every bi-encoder stage (`retriever`). A transfer job
    (``target`` B) keeps A's model-side settings (batch size, embedding dtype) and takes B's corpus side and B's
    lengths (``transfer_max_length``, in place of the stage's query and passage lengths)."""
    params = job_params(config, dataset, "retriever")
    if target is None:
        return params
    theirs = job_params(config, target, "retriever")
    return {**params, **{key: theirs[key] for key in CORPUS_SIDE},
            "transfer_max_length": transfer_max_length(config, target)}


def transfer_max_length(config: dict, target: str) -> dict:
    """``{"query", "passage"}``: the lengths target B's queries and passages are encoded at by another dataset's
    bi-encoders (B's ``transfer_max_length``; None: each model's own max_seq_length, resolved by the job)."""
    declared = config["datasets"][target].get("transfer_max_length") or {}
    return {"query": declared.get("query"), "passage": declared.get("passage")}


def mining(config: dict, dataset: str, stage: str) -> dict:
    """How negatives are drawn from ``stage``'s train-split run (`mining.<stage>`: depth, keep, seed, and the
    filters that are on: a filter left at null is not handed on, so a run without filters keeps its params;
    ``denoise`` with its model as the jobs load it, :func:`denoise_model`)."""
    params = {key: value for key, value in stage_params(config, dataset, "mining")[stage].items()
              if not (key in NEGATIVE_FILTERS and value is None)}
    if "denoise" in params:
        kept = {key: value for key, value in params["denoise"].items()
                if key == "model" or key not in DenoiseScoringSettings.keys()}
        params["denoise"] = {**kept, "model": denoise_model(config, dataset, stage)}
    return params


def denoise_model(config: dict, dataset: str, stage: str) -> str | None:
    """The cross-encoder that denoises ``stage``'s mined pool (`mining.<stage>.denoise.model`) as its job loads
    it: a chain stage's word (``reranker``) is that stage's model folder, anything else as written; None: off."""
    denoise = stage_params(config, dataset, "mining")[stage].get("denoise")
    if denoise is None:
        return None
    return model_dir(denoise["model"], dataset) if denoise["model"] in denoisers() else denoise["model"]


def denoise_pool(config: dict, dataset: str, stage: str) -> dict:
    """What the job writing ``stage``'s denoising pool reads: the mining ``depth``."""
    return {"depth": stage_params(config, dataset, "mining")[stage]["depth"]}


def denoise_scoring(config: dict, dataset: str, stage: str) -> dict:
    """What a denoising scores' job of ``stage`` reads: the cross-encoder (``model``), its ``max_length``,
    ``batch_size``, ``bf16`` and the number of ``shards`` (not the thresholds: changing one re-runs the mining job
    only)."""
    denoise = stage_params(config, dataset, "mining")[stage]["denoise"]
    return DenoiseScoringSettings.pick({**denoise, "model": denoise_model(config, dataset, stage)})


def search_depth(config: dict, dataset: str, stage: str, split: str, target: str | None = None) -> int:
    """Hits per query of ``stage``'s run on ``split`` (of ``target`` for a transfer): the full depth
    (bm25.depth, retriever.search_depth), except a train split searched only to be mined, which stops at the
    mining depth."""
    if stage == "bm25":
        full = bm25(config, dataset)["depth"]
    else:
        full = encoding(config, dataset, target)["search_depth"]
    collection = config["datasets"][dataset]
    mined = stage in stage_params(config, dataset, "mining") and target is None
    if mined and split == collection.get("train_split") and split not in collection["eval_splits"]:
        return min(full, mining(config, dataset, stage)["depth"])
    return full


def reranker(config: dict, dataset: str, target: str | None = None) -> dict:
    """The re-ranker's training and scoring settings (`reranker` but the fusion's); re-ranking target B's BM25 run
    goes `transfer.rerank_depth` deep."""
    params = job_params(config, dataset, "reranker")
    params["plm"] = model_source(config, params["plm"])
    return params if target is None else {**params, "rerank_depth": config["transfer"]["rerank_depth"]}


def train_reranker(config: dict, dataset: str) -> dict:
    """What the re-ranker's training job reads: the keys of
    :class:`~dpr_pipeline.training.settings.RerankerSettings` from :func:`reranker`."""
    return RerankerSettings.pick(reranker(config, dataset))


def rerank(config: dict, dataset: str, target: str | None = None) -> dict:
    """What a re-ranking job reads (:class:`~dpr_pipeline.reranking.settings.RerankSettings`)."""
    return RerankSettings.pick(reranker(config, dataset, target))


def teacher_scores(config: dict, dataset: str) -> dict:
    """What a teacher-scores job reads (:class:`~dpr_pipeline.reranking.settings.TeacherScoreSettings`)."""
    return TeacherScoreSettings.pick(reranker(config, dataset))


#: The distilled retriever's settings that decide which pairs it draws (training.groups, training.trainer).
DRAW_KEYS = ("seed", "negatives_per_query") + STEP_KEYS


@resolves("reranker", "teacher_pairs")
def teacher_draws(config: dict, dataset: str) -> dict | None:
    """What the teacher jobs need to score only the pairs the distilled retriever draws
    (``reranker.teacher_pairs: drawn``): the student's :data:`DRAW_KEYS`; None (``all``): every pair."""
    if stage_params(config, dataset, "reranker")["teacher_pairs"] == "all":
        return None
    student = stage_params(config, dataset, declared("distill").block)
    return {key: student[key] for key in DRAW_KEYS if key in student}


@resolves("distill", "teacher")
def teacher_scores_file(config: dict, dataset: str) -> str:
    """The file (in the teacher's stage folder) of the scores the distilled retriever learns, as ``distill.teacher``
    says (:data:`TEACHER_SCORES`); a change reruns the student through its input, not its params."""
    return TEACHER_SCORES[stage_params(config, dataset, declared("distill").block)["teacher"]]


@resolves("distill", "pseudo_queries", "pseudo_query_source", "pseudo_query_min_words", "pseudo_query_max_words")
def pseudo_queries(config: dict, dataset: str) -> dict | None:
    """What the pseudo-query job reads (:class:`~dpr_pipeline.data.pseudo_queries.PseudoQuerySettings`: the
    student's ``pseudo_*`` keys and its seed); None where ``distill.pseudo_queries`` is 0: no pseudo-query jobs, the
    student learns the labelled queries alone."""
    student = stage_params(config, dataset, declared("distill").block)
    return PseudoQuerySettings.pick(student) if student["pseudo_queries"] else None


def pseudo_query_mining(config: dict, dataset: str) -> dict:
    """How the pseudo-queries' candidates are drawn from the run of the stage that feeds the student: as its train
    queries' (`mining.<that stage>`), less the cross-encoder denoising (``denoise``), which scores only the train
    pool; the teacher scores every candidate the student sees."""
    return {key: value for key, value in mining(config, dataset, declared("distill").fed_by).items()
            if key != "denoise"}


@resolves("reranker", "fusion_weight", "fusion_metric")
def fusion(config: dict, dataset: str) -> dict:
    """How a re-ranked run mixes the re-ranker's and Retriever2's scores (:mod:`dpr_pipeline.reranking.score_fusion`),
    what
    every rule, input function and job about the fusion asks: ``weight``, ``{"value", "choice"}``
    (:func:`dpr_pipeline.reranking.score_fusion.weight_setting`: a number, or the file recording the one chosen on
    ``split``,
    the dataset's dev split, by ``metric`` at its ``relevance_level``), over the top ``depth`` hits."""
    params = stage_params(config, dataset, "reranker")
    collection = config["datasets"][dataset]
    dev = dev_split_of(collection)
    split = dev.name if dev is not None else None
    return {"weight": weight_setting(params["fusion_weight"], dataset), "metric": params["fusion_metric"],
            "depth": params["rerank_depth"], "split": split,
            "relevance_level": collection.get("metric_relevance", {}).get(split, 1)}


def training_processes(config: dict, dataset: str, block: str) -> int:
    """Training processes of a training stage's jobs (torchrun DDP, one per GPU: the GPUs the job asks for);
    ``block``: pretrain, retriever, reranker or distill."""
    return stage_params(config, dataset, block)["processes"]


def training_nodes(config: dict, dataset: str, block: str) -> int:
    """The nodes a training stage's jobs spread their processes over (one torchrun each; 1: ``torchrun
    --standalone``); ``block`` as for :func:`training_processes`."""
    return stage_params(config, dataset, block)["nodes"]


def pretraining_in_chain(config: dict, dataset: str) -> list[str]:
    """The pre-training stages the main chain trains (``pretrain/{method}``): `pretrain.method` when a bi-encoder
    starts from it, else none."""
    if any(stage_params(config, dataset, block)["plm"] == "pretrain" for block in blocks(BIENCODER)):
        return [member(PRETRAINING, pretrain(config, dataset)["method"])]
    return []
