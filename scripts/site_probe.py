"""The site file proposed from what the cluster says (`make site`, on the login node): the config's `cluster` block
from sinfo, scontrol and sacctmgr, each value with the command that gave it, for you to review before
`make cluster-check` (docs/cluster.md, step 2).

    .venv/bin/python scripts/site_probe.py            # writes site.yaml (or $DPR_PIPELINE_SITE's file)

An existing site file is never replaced: the proposal goes beside it, as site.proposed.yaml, to compare. Without
Slurm (no sinfo) it writes a template instead: every cluster key commented out, with its description.
"""
import argparse
import sys
import time
from pathlib import Path

from dpr_pipeline.orchestration.cluster_site import site_path
from dpr_pipeline.orchestration.site_probe import probe_site, site_text, write_site


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=None,
                        help="the site file (default: $DPR_PIPELINE_SITE, else site.yaml)")
    args = parser.parse_args(argv)
    output = args.output or site_path()
    found = probe_site()
    when = time.strftime("%Y-%m-%d")
    header = ("The site file (docs/cluster.md): the config's cluster block, read by every run. "
              + (f"Proposed by `make site` on {when} from sinfo, scontrol and sacctmgr: review each value (its "
                 "comment names the command that gave it), then `make cluster-check`." if found is not None else
                 f"A template written by `make site` on {when}, where sinfo did not answer (no Slurm here): "
                 "uncomment and set the keys your cluster needs, then `make cluster-check` on its login node."))
    written = write_site(output, site_text(found, header=header))
    if written != output:
        print(f"{output} exists and is kept: the proposal is {written}; compare them (diff {output} {written}) "
              f"and copy what you want into {output}")
    else:
        print(f"wrote {written}" + (": review it, then `make cluster-check`" if found is not None else
                                    ": a template (no sinfo here); set its keys, then `make cluster-check`"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
