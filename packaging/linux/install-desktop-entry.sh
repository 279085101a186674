#!/usr/bin/env bash
# Puts Tandem in this user's application menu: a .desktop entry that starts the executable
# beside this script, and Tandem's icon. The bundle runs from wherever its folder is, so run
# this again after moving the folder. Nothing outside ~/.local/share (XDG_DATA_HOME) changes.
set -euo pipefail
bundle=$(cd "$(dirname "$0")" && pwd)
executable="$bundle/tandem"
[ -x "$executable" ] || { echo "There is no tandem executable beside this script (in $bundle)." >&2; exit 1; }
data=${XDG_DATA_HOME:-$HOME/.local/share}
icons="$bundle/_internal/resources/icons"
install -D -m 644 "$icons/tandem.png" "$data/icons/hicolor/256x256/apps/tandem.png"
install -D -m 644 "$icons/tandem.svg" "$data/icons/hicolor/scalable/apps/tandem.svg"
mkdir -p "$data/applications"
# The desktop entry spec quotes an Exec path that has spaces; a " or \ in it would need escaping.
sed "s|@EXEC@|\"$executable\"|" "$bundle/tandem.desktop.in" > "$data/applications/tandem.desktop"
if command -v update-desktop-database >/dev/null; then
    update-desktop-database -q "$data/applications" || true
fi
echo "Tandem is in the application menu ($data/applications/tandem.desktop)."
