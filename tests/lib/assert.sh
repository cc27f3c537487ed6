# The scenarios' assertions (source it after scripts/lib.sh). Each check
# prints one line, "ok: ..." or "FAIL: ...", and a failure is counted in
# $fails; a scenario ends with `finish NAME`, which prints the count and
# returns its verdict (the script's exit status when it is the last line).
#   expect WHAT GOT WANT   GOT must equal WANT (strings)
#   fail WHAT              a failure found some other way
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
expect() { # what got want
  if [ "$2" = "$3" ]; then echo "ok: $1 ($2)"; else fail "$1: got '$2', want '$3'"; fi
}
finish() { # name
  echo "$1 checks failed: $fails"
  [ "$fails" = 0 ]
}
