#!/bin/bash
# The same command run in two checkouts of Tandem, alternating, REPEATS times (default 3), each
# line of its output prefixed with the checkout's folder name. For a change that spans Python and
# C (a cache layout), which prefill_native.py's switch of C libraries under one loaded model
# cannot compare; alternating runs let the host's drift move both alike.
#
#   git worktree add /tmp/before HEAD~1
#   REPEATS=5 docs/bench/two_checkouts.sh /tmp/before . \
#       sh -c 'tandem chat --method ar --max-new-tokens 8 < message.txt | grep -o "first token [0-9]* ms"'
#
# In each run `tandem` and `python` are this repository's .venv's, importing that checkout's
# engine first. A checkout without built kernels compiles them at first use.
set -euo pipefail
before=$(cd "$1" && pwd)
after=$(cd "$2" && pwd)
shift 2
venv=$(cd "$(dirname "$0")/../.." && pwd)/.venv/bin
commands=$(mktemp -d)
trap 'rm -rf "$commands"' EXIT
cat > "$commands/tandem" <<TANDEM
#!/bin/sh
exec "$venv/python" -c 'import sys; from engine.cli import main; sys.argv[0] = "tandem"; sys.exit(main())' "\$@"
TANDEM
printf '#!/bin/sh\nexec "%s/python" "$@"\n' "$venv" > "$commands/python"
chmod +x "$commands/tandem" "$commands/python"
for repeat in $(seq "${REPEATS:-3}"); do
    for checkout in "$before" "$after"; do
        (cd "$checkout" && PYTHONPATH="$checkout" PATH="$commands:$PATH" "$@" | sed "s|^|$(basename "$checkout") |")
    done
done
