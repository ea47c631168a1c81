"""The Snakemake report's plots and tables, and the jobs' throughput."""
