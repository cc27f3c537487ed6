# A file of scenarios (tests/scenarios/GROUP.sh): each scenario is a function
# scenario_NAME, and the file ends with `scenario_main "$@"`:
#   bash tests/scenarios/GROUP.sh NAME [ARG...]   runs that one, in its own process
# A file without scenario_ functions is one scenario, named after the file.
# tests/lib/suite.sh finds a scenario's file by its name (scenario_file).
scenario_main() { # name [arg...]
  local name=${1:-}
  if [ -z "$name" ] || ! declare -F "scenario_$name" > /dev/null; then
    echo "usage: bash $0 NAME  (NAME: $(declare -F | sed -n 's/^declare -f scenario_//p' | grep -vx main | tr '\n' ' '))" >&2
    exit 2
  fi
  shift
  "scenario_$name" "$@"
}

# The scenarios' assertions (also for the portable edition's steps, which
# source this file). Each check prints one line, "ok: ..." or "FAIL: ...",
# and a failure is counted in $fails; a scenario ends with `finish NAME`,
# which prints the count and returns its verdict (the scenario's exit
# status when it is its last line).
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
