#!/bin/sh
# The Python that `make` creates .venv with: the first of $1 (a PYTHON given to make), else
# python3.11, python3.12 and python3 on PATH, whose version is 3.11 or 3.12 and which can make a
# virtual environment. Prints its path and, on stderr, one line saying what it found; or says
# why none will do, with the line that installs a good one on this system, and exits 1.
SUPPORTED="3.11 3.12"        # 3.11: what make test runs; 3.12: Colab's, the unit tests pass on it
found=""
for candidate in ${1:-python3.11 python3.12 python3}; do
  exe=$(command -v "$candidate" 2>/dev/null) || { found="$found, $candidate (not found)"; continue; }
  version=$("$exe" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || version="?"
  case " $SUPPORTED " in
    *" $version "*)
      if "$exe" -c 'import venv, ensurepip' 2>/dev/null; then
        echo "make: Python $version ($exe)" >&2
        echo "$exe"
        exit 0
      fi
      found="$found, $candidate $version (without its venv module)";;
    *) found="$found, $candidate $version";;
  esac
done
found=${found#, }
case "$(uname -s)" in
  Darwin) install="brew install python@3.11   (Homebrew: https://brew.sh)";;
  Linux)
    if command -v apt-get >/dev/null 2>&1; then
      install="sudo apt-get install python3.11 python3.11-venv   (Ubuntu 24.04: first sudo add-apt-repository ppa:deadsnakes/ppa)"
    elif command -v dnf >/dev/null 2>&1; then
      install="sudo dnf install python3.11"
    else
      install="uv python install 3.11   (uv: https://docs.astral.sh/uv/)"
    fi;;
  *) install="uv python install 3.11   (uv: https://docs.astral.sh/uv/)";;
esac
echo "error: make needs Python 3.11 or 3.12 with its venv module; found: $found." >&2
echo "  Install one:  $install" >&2
echo "  then run make again (or name it: make PYTHON=/path/to/python3.11)." >&2
exit 1
