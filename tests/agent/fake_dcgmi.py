#!/usr/bin/env python3
"""A stand-in for `dcgmi diag -r 3 -j`: what DCGM's diagnostic prints and how it exits.

FAKE_DCGMI chooses the outcome: pass (exit 0, every test Pass), fail (exit
226 with one test Fail, as dcgmi does when a test fails), fail-quietly (exit
0, yet one test Fail in the JSON: the agent must read the JSON too), hang
(never answers: the agent's timeout must kill it). The GPUs it was asked to
test (-i) are written into the output, and argv into FAKE_DCGMI_LOG when set.
"""

import json
import os
import sys
import time


def main() -> int:
    argv = sys.argv[1:]
    log = os.environ.get("FAKE_DCGMI_LOG")
    if log:
        with open(log, "a") as f:
            f.write(" ".join(argv) + "\n")
    outcome = os.environ.get("FAKE_DCGMI", "pass")
    gpus = argv[argv.index("-i") + 1] if "-i" in argv else "all"
    if outcome == "hang":
        time.sleep(3600)
    failing = outcome in ("fail", "fail-quietly")
    report = {
        "DCGM GPU Diagnostic": {
            "test_categories": [
                {
                    "category": "Hardware",
                    "tests": [
                        {
                            "name": "Memory",
                            "results": [
                                {
                                    "gpu_ids": gpus,
                                    "status": "Fail" if failing else "Pass",
                                    **({"info": "uncorrectable memory errors"} if failing else {}),
                                }
                            ],
                        },
                        {"name": "Diagnostic", "results": [{"gpu_ids": gpus, "status": "Pass"}]},
                    ],
                }
            ]
        }
    }
    print(json.dumps(report, indent=2))
    return 226 if outcome == "fail" else 0


if __name__ == "__main__":
    sys.exit(main())
