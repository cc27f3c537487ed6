#!/usr/bin/env bash
# For tests/scenarios/java_spring.sh: Maven, and every artifact the build
# of clients/java needs under Spring Boot 3.5 and 4.0 (Spring Boot,
# Hibernate, pgJDBC, JUnit, Maven's
# plugins and Surefire's JUnit provider, spring-kafka) fetched from Maven
# Central into $IDEM_MAVEN_REPO (lib.sh), so that the scenario builds
# offline; and the jars of the Kafka broker the scenario runs (kafka_2.13,
# KRaft) copied into $IDEM_KAFKA_LIBS. The JDK
# comes from 30-examples.sh. Skipped when that repository already served
# these pom files.
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

command -v mvn >/dev/null || {
  say "installing Maven"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends maven >/dev/null
}

src="$ROOT/clients/java"
stamp="$IDEM_MAVEN_REPO/.idem-stamps/$(cat "$src"/pom.xml "$src"/*/pom.xml | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  say "filling Maven's repository for clients/java ($IDEM_MAVEN_REPO)"
  scratch=$(mktemp -d /tmp/java-setup.XXXXXX)
  tar -C "$src" --exclude=target -cf - . | tar -C "$scratch" -xf -
  # The whole build with the starter's database-free test (that resolves
  # Surefire's provider); the application test needs a database and is
  # left out here (no test of that name matches in its module).
  # Both Spring Boot lines the scenario builds (JAVA_BOOT_VERSIONS there).
  for boot in 3.5.7 4.0.7; do
    if ! (cd "$scratch" && mvn_idem -q clean verify -Dspring-boot.version=$boot -Dtest=OutsideTransactionTest \
            -Dsurefire.failIfNoSpecifiedTests=false) > "$scratch.log" 2>&1; then
      tail -40 "$scratch.log"; rm -rf "$scratch" "$scratch.log"; exit 1
    fi
  done
  rm -rf "$scratch" "$scratch.log"
  mkdir -p "$(dirname "$stamp")"
  touch "$stamp"
fi

if [ ! -f "$IDEM_KAFKA_LIBS/.complete" ]; then
  say "fetching the Kafka broker's jars ($IDEM_KAFKA_LIBS)"
  rm -rf "$IDEM_KAFKA_LIBS"
  mvn_idem -q -f "$src/it/kafka-broker/pom.xml" dependency:copy-dependencies -DoutputDirectory="$IDEM_KAFKA_LIBS" \
    || { rm -rf "$IDEM_KAFKA_LIBS"; exit 1; }
  touch "$IDEM_KAFKA_LIBS/.complete"
fi
