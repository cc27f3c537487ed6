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
