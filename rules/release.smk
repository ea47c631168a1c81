# A stage's model released with its card and metrics.


rule release_model:
    # a stage's model folder ready to publish: its files hard-linked, and a model card with the stage's metrics
    # per split (the model folder's own card has none: metrics come after training). Not in the default target:
    # `snakemake results/<dataset>/<stage>/release`.
    input:
        unpack(export_sample_inputs),  # release.export: the texts the ONNX copies are checked on
        model=model_dir("{stage}"),
        manifest=stage_file("{stage}", "manifest.json"),
        metrics=stage_file("{stage}", "metrics.json"),
        fusion=fusion_choice,
    output:
        directory(release_dir("{stage}")),
    wildcard_constraints:
        stage="|".join(BIENCODERS + CROSS_ENCODERS),
    params:
        fusion_weight=lambda wc: settings.fusion(config, wc.dataset)["weight"] if wc.stage in CROSS_ENCODERS else None,
        export=export_formats,
    threads: threads_of("release_model")
    resources:
        **resources_of("release_model"),
    log:
        log_file("release_model_{stage}"),
    benchmark:
        benchmark_file("release_model_{stage}")
    conda:
        torch_env("release_model")
    script:
        "../workflow_scripts/release_model.py"
