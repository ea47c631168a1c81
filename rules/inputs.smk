# Input functions: which files a job reads, from the config and the wildcards (paths from dpr_pipeline.layout).
from dpr_pipeline.models.hub_fetch import is_fetched
from dpr_pipeline.pretraining.methods import RANDOM_GENERATOR, pretraining_method


def leakage_inputs(wildcards):
    """An evaluation split's ingestion also reads the train split's queries, to refuse shared queries (leakage)."""
    train = dataset_config(wildcards).get("train_split")
    if train is None or wildcards.split == train:
        return {}
    return {"train_queries": data_file(f"queries_{train}.parquet", wildcards.dataset)}


def train_queries(wildcards):
    return data_file(f"queries_{train_split(wildcards)}.parquet", wildcards.dataset)


def train_qrels(wildcards):
    return data_file(f"qrels_{train_split(wildcards)}.parquet", wildcards.dataset)


def encoded_shards(wildcards):
    """A stage's corpus encoding shards; with a {target} B (transfer_build_index), the shards of B's corpus."""
    target = wildcards.get("target")
    shards = range(settings.encoding(config, wildcards.dataset, target)["encode_shards"])
    folder = f"transfer/{target}/embeddings" if target else "embeddings"
    stem = stage_file(wildcards.stage, f"{folder}/shard_", wildcards.dataset)
    return {"vectors": [f"{stem}{i}.npy" for i in shards], "ids": [f"{stem}{i}.ids.parquet" for i in shards]}


def teacher_shards(wildcards):
    shards = range(settings.reranker(config, wildcards.dataset)["teacher_shards"])
    return [stage_file("reranker", f"teacher/shard_{i}.parquet", wildcards.dataset) for i in shards]


def fusion_choice_inputs(wildcards):
    """What fusion_weight `dev` is chosen on: the dev split's re-ranker runs and those it re-ranked (Retriever2's),
    and its qrels."""
    dev = settings.fusion(config, wildcards.dataset)["split"]
    return {"reranker": stage_file("reranker", f"cross_encoder/run_{dev}.trec", wildcards.dataset),
            "first_stage": stage_file(RERANKED, f"run_{dev}.trec", wildcards.dataset),
            "qrels": data_file(f"qrels_{dev}.parquet", wildcards.dataset)}


def distill_groups(wildcards):
    """The groups the teacher scores and the student draws: Retriever2's mined negatives of the train queries, with
    the pseudo-queries' appended where distill.pseudo_queries is on."""
    if settings.pseudo_queries(config, wildcards.dataset) is None:
        return stage_file(RERANKED, "negatives.parquet", wildcards.dataset)
    return stage_file("distill", "training_groups.parquet", wildcards.dataset)


def distill_queries(wildcards):
    """The texts of distill_groups' queries: the train split's, with the pseudo-queries' where they are on."""
    if settings.pseudo_queries(config, wildcards.dataset) is None:
        return train_queries(wildcards)
    return stage_file("distill", "training_queries.parquet", wildcards.dataset)


def distill_teacher_scores(wildcards):
    """The scores the distilled retriever learns (distill.teacher): the teacher's, or those fused with Retriever2's."""
    return stage_file(stages.stage("distill").teacher, settings.teacher_scores_file(config, wildcards.dataset),
                      wildcards.dataset)


def fused_teacher_inputs(wildcards):
    """The teacher's scores, the groups they scored (distill_groups, whose scores are Retriever2's), and the fusion
    weight's choice (fusion_choice)."""
    return {"teacher": stage_file("reranker", TEACHER_SCORES["reranker"], wildcards.dataset),
            "first_stage": distill_groups(wildcards), "choice": fusion_choice(wildcards)}


def fusion_inputs(wildcards):
    """A fused run's two runs, and the weight's choice (fusion_choice)."""
    return {"reranker": stage_file("reranker", f"cross_encoder/run_{wildcards.split}.trec", wildcards.dataset),
            "first_stage": stage_file(RERANKED, f"run_{wildcards.split}.trec", wildcards.dataset),
            "choice": fusion_choice(wildcards)}


def export_sample_inputs(wildcards):
    """A release with `release.export`: the texts its ONNX copies are checked on, from the dataset's first
    evaluation split: its queries and the corpus, and a bi-encoder's qrels (where judged by qrels) or a re-ranker's
    own run of the split (its top pairs); none otherwise."""
    if not export_formats(wildcards):
        return {}
    split = config["datasets"][wildcards.dataset]["eval_splits"][0]
    inputs = {"sample_queries": data_file(f"queries_{split}.parquet"), "sample_corpus": data_file("corpus.parquet")}
    if wildcards.stage in CROSS_ENCODERS:
        inputs["sample_run"] = stage_file(wildcards.stage, f"cross_encoder/run_{split}.trec", wildcards.dataset)
    elif relevance_of(wildcards) != "answers":
        inputs["sample_qrels"] = data_file(f"qrels_{split}.parquet")
    return inputs


def export_formats(wildcards):
    """`release.export`: the ONNX copies a release writes (bi-encoders and re-rankers alike)."""
    return list(config["release"]["export"])


def fusion_choice(wildcards):
    """The file recording the re-ranker's fusion weight where it is chosen on the dev split (the `choice` of
    settings.fusion's weight), for the jobs about the re-ranker (a release job's {stage}); nothing for a number."""
    choice = settings.fusion(config, wildcards.dataset)["weight"]["choice"]
    return [choice] if choice is not None and wildcards.get("stage", "reranker") in CROSS_ENCODERS else []


def bm25_negatives_pool(wildcards):
    """Official BM25 negatives when the dataset names a file, else our Pyserini train run."""
    if "official_negatives" in dataset_config(wildcards):
        return data_file("official_negatives.parquet", wildcards.dataset)
    return stage_file("bm25", f"run_{train_split(wildcards)}.trec", wildcards.dataset)


def token_shards(wildcards):
    shards = range(settings.pretrain(config, wildcards.dataset)["tokenize_shards"])
    return [stage_file("tokens", f"part_{i}.arrow", wildcards.dataset) for i in shards]


def initialisation_input(stage=None):
    """The model a bi-encoder job starts from (``stage``'s, else the job's {stage}'s) as a job input when the
    workflow builds it (a pre-training output) or fetches it (a Hub name's folder), else nothing (a local folder,
    ``pkg:``)."""

    def inputs(wildcards):
        model = settings.initialisation(config, wildcards.dataset, stage or wildcards.stage)
        return [model] if made_here(model) else []

    return inputs


def selection_inputs(stage=None):
    """What a bi-encoder job (``stage``'s, else the job's {stage}'s) chooses on between its trained model and its
    start (stage_settings.selection): the dev split's queries and qrels and, where the start is a chain stage's
    model (``start``, Retriever1, Retriever2), that stage's dev run (and for a student, its teacher's and its
    start's metrics); nothing where it hands on unchecked."""

    def inputs(wildcards):
        selection = settings.selection(config, wildcards.dataset, stage or wildcards.stage)
        chosen = DevSelectionSettings.from_params(selection)
        dev = chosen.split
        if dev is None:
            return {}
        files = {"dev_queries": data_file(f"queries_{dev}.parquet", wildcards.dataset),
                 "dev_qrels": data_file(f"qrels_{dev}.parquet", wildcards.dataset)}
        if chosen.start_stage is not None:
            files["dev_start_run"] = stage_file(chosen.start_stage, f"run_{dev}.trec", wildcards.dataset)
        if chosen.teacher_stage is not None:  # a student is trained only from a teacher above its start on dev
            files["teacher_metrics"] = stage_file(chosen.teacher_stage, "metrics.json", wildcards.dataset)
            files["start_metrics"] = stage_file(chosen.start_stage, "metrics.json", wildcards.dataset)
        return files

    return inputs


def made_here(model):
    """Whether a job's model is a file of this workflow's, which the job takes as an input: a stage's output (a
    pre-training result, its start) or a fetched Hub model's folder (models/hub_fetch.py); not a local folder nor
    ``pkg:``."""
    return model.startswith(f"{RESULTS}/") or is_fetched(config, model)


def model_inputs(*models):
    """Of the models a job loads, those the workflow makes (:func:`made_here`), so that the jobs making them run
    first: ``models`` are functions of the wildcards giving a model reference each, as the job gets it."""

    def inputs(wildcards):
        return [model for model in (get(wildcards) for get in models) if made_here(model)]

    return inputs


def pretrain_plm(wildcards):
    """The encoder pre-training (and its tokenisation, its n-gram counts) starts from."""
    return settings.pretrain(config, wildcards.dataset)["plm"]


def pretrain_generator(wildcards):
    """The generator a ``pretrain/{method}`` job loads: `pretrain.generator` when the method has one (the words
    ``random`` and none are no model)."""
    uses = pretraining_method(wildcards.method).generator
    return settings.pretrain(config, wildcards.dataset)["generator"] if uses else RANDOM_GENERATOR


def reranker_plm(wildcards):
    return settings.reranker(config, wildcards.dataset)["plm"]


def evaluation_inputs(wildcards):
    """A stage's runs per evaluation split of the evaluated dataset (a transfer target's runs live under
    results/{A}/{stage}/transfer/{B}/) and what judges them there: qrels, or answers and the corpus."""
    judged = wildcards.get("target", wildcards.dataset)
    splits = evaluated_dataset(wildcards)["eval_splits"]
    stem = stage_file(wildcards.stage, f"transfer/{judged}/" if "target" in wildcards.keys() else "", wildcards.dataset)
    inputs = {"runs": [f"{stem}run_{s}.trec" for s in splits]}
    if relevance_of(wildcards) == "answers":
        inputs["answers"] = [data_file(f"answers_{s}.parquet", judged) for s in splits]
        inputs["corpus"] = data_file("corpus.parquet", judged)
    else:
        inputs["qrels"] = [data_file(f"qrels_{s}.parquet", judged) for s in splits]
    return inputs


def mining_answer_inputs(wildcards):
    """Answer-based datasets: the train answers, so mined negatives contain no answer (the job's corpus input gives
    the passages' text)."""
    if relevance_of(wildcards) != "answers":
        return {}
    return {"answers": data_file(f"answers_{train_split(wildcards)}.parquet", wildcards.dataset)}


def bm25_negatives_answer_inputs(wildcards):
    """As mining_answer_inputs, for BM25 negatives taken from our Pyserini run (official ones are left as is)."""
    return {} if "official_negatives" in dataset_config(wildcards) else mining_answer_inputs(wildcards)


def mining_pool(wildcards):
    """What a mined stage's candidates come from: BM25's pool (bm25_negatives_pool), else the stage's train run."""
    if wildcards.stage == "bm25":
        return bm25_negatives_pool(wildcards)
    return stage_file(wildcards.stage, f"run_{train_split(wildcards)}.trec", wildcards.dataset)


def denoise_pool_inputs(wildcards):
    """A denoising pool job's inputs beside the run or official negatives (mining.<stage>.denoise): the answers and
    corpus that keep answer-bearing hits out of a run's pool."""
    answers = (bm25_negatives_answer_inputs if wildcards.stage == "bm25" else mining_answer_inputs)(wildcards)
    return {**answers, **({"corpus": data_file("corpus.parquet", wildcards.dataset)} if answers else {})}


def denoise_scores_inputs(wildcards):
    """A denoising scores job's cross-encoder, when the workflow makes or fetches it (mining.<stage>.denoise)."""
    model = settings.denoise_model(config, wildcards.dataset, wildcards.stage)
    return {"model": model} if made_here(model) else {}


def denoise_shards(wildcards):
    """The scoring jobs' parts of a mined stage's denoising scores (mining.<stage>.denoise.shards)."""
    shards = range(settings.denoise_scoring(config, wildcards.dataset, wildcards.stage)["shards"])
    return [denoise_shard_file(wildcards.stage, i, wildcards.dataset) for i in shards]


def denoise_input(stage=None):
    """A mining job's denoising scores (``stage``'s, else the job's {stage}'s) when mining.<stage>.denoise is on,
    else nothing."""

    def inputs(wildcards):
        name = stage or wildcards.stage
        if settings.denoise_model(config, wildcards.dataset, name) is None:
            return {}
        return {"denoise_scores": denoise_scores_file(name, wildcards.dataset)}

    return inputs


# Zero-shot transfer (rules/transfer.smk): {dataset} = A, the dataset the models trained on; {target} = B.
def evaluated_dataset(wildcards):
    """The dataset whose qrels and evaluation settings score a job's runs: the transfer target B when the job
    has one (transfer_evaluate), else the job's own dataset (evaluate)."""
    return config["datasets"][wildcards.get("target", wildcards.dataset)]


def transfer_leakage_inputs(wildcards):
    """What transfer_leakage compares: B's evaluation queries, and A's train queries when A has a train split."""
    train = dataset_config(wildcards).get("train_split")
    targets = config["datasets"][wildcards.target]["eval_splits"]
    inputs = {"target_queries": [data_file(f"queries_{s}.parquet", wildcards.target) for s in targets]}
    return {**inputs, "train_queries": data_file(f"queries_{train}.parquet", wildcards.dataset)} if train else inputs


TRANSFER_LEAKAGE = dataset_file("transfer_leakage_{target}.json")


def transfer_models(wildcards):
    """The model folders of A's transferred bi-encoders, in transfer.stages order (the summary's lengths)."""
    return [stage_file(stage, "model", wildcards.dataset)
            for stage in config["transfer"]["stages"] if stage in BIENCODERS]


def transfer_metrics(wildcards):
    """Per target B, in transfer_to order: B's own BM25 (the baseline column), then each transferred stage."""
    return [
        path
        for target in dataset_config(wildcards)["transfer_to"]
        for path in [stage_file("bm25", "metrics.json", target)]
        + [stage_file(stage, f"transfer/{target}/metrics.json", wildcards.dataset) for stage in config["transfer"]["stages"]]
    ]
