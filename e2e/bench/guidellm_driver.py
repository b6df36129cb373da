"""Runs GuideLLM's own `guidellm run` command several times in one process.

A fresh `guidellm` process spends ~5 s of CPU importing before its first request, and the
benchmark runs eighteen or more of them on two cores. This driver imports GuideLLM once and
executes each job (one JSON array of `guidellm` CLI arguments per stdin line) through the
same click command the CLI uses, so every run is configured exactly as the documented command
line would configure it. After each job it prints `done <exit code>` on stdout.

GuideLLM's log output goes to stderr; the harness points it at a file.
"""

import json
import sys


def main():
    from guidellm.cli import cli

    for line in sys.stdin:
        if not line.strip():
            continue
        args = json.loads(line)
        try:
            cli.main(args=args, standalone_mode=False)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except Exception as e:  # noqa: BLE001 - reported to the harness, which fails the run
            print(f"guidellm failed: {e!r}", file=sys.stderr, flush=True)
            code = 1
        print(f"done {code}", flush=True)


if __name__ == "__main__":
    main()
