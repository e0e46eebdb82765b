"""A recording stand-in for launchctl, systemctl, journalctl and tail.

Copied onto PATH under each tool's name. Every call appends one JSON line to
$FAKE_TOOLS_LOG: the argv, and the SHA-256 of $FAKE_TOOLS_WATCH at that
moment (or null), so tests can tell whether a command ran before or after
the unit file was written. $FAKE_TOOLS_RULES (JSON, read on every call) maps
"<tool> <verb>" or "<tool>" to {"status", "stdout", "stderr"}.
"""

import hashlib
import json
import os
import sys


def main() -> int:
    name = os.path.basename(sys.argv[0])
    args = sys.argv[1:]
    watch = os.environ.get("FAKE_TOOLS_WATCH", "")
    digest = None
    if watch and os.path.exists(watch):
        with open(watch, "rb") as handle:
            digest = hashlib.sha256(handle.read()).hexdigest()
    with open(os.environ["FAKE_TOOLS_LOG"], "a", encoding="utf-8") as log:
        log.write(json.dumps({"argv": [name, *args], "watched": digest}) + "\n")
    rules = {}
    rules_path = os.environ.get("FAKE_TOOLS_RULES", "")
    if rules_path and os.path.exists(rules_path):
        with open(rules_path, encoding="utf-8") as handle:
            rules = json.load(handle)
    verb = next((a for a in args if not a.startswith("-")), "")
    rule = rules.get(f"{name} {verb}") or rules.get(name) or {}
    sys.stdout.write(rule.get("stdout", ""))
    sys.stderr.write(rule.get("stderr", ""))
    return int(rule.get("status", 0))


if __name__ == "__main__":
    sys.exit(main())
