"""The scale rehearsal: synthetic MS MARCO, the msmarco chain under Slurm, and each job's peak memory."""
