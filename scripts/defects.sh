#!/usr/bin/env bash
# The defect matrix: seeds one defect at a time (a failpoint of shardwise-runtime's
# `failpoints` feature, see crates/shardwise-runtime/src/failpoints.rs) and runs the test that
# must catch it. A row passes when that test FAILS with a message naming the defect; a test
# that passes with the defect seeded, or fails for another reason, fails the matrix. Prints a
# table (defect, test, time to catch) for docs/testing.md; exits non-zero if a row did not
# catch its defect.
#
# Usage: scripts/defects.sh [defect ...]   (no argument: every row)
# Needs what `make test` needs (the control plane built: scripts/control-plane.sh). Not part
# of CI: each row rebuilds the binaries with the feature and runs its suite with the defect.
set -uo pipefail
cd "$(dirname "$0")/.."

FEATURE=shardwise-runtime/failpoints
LOG_DIR=${DEFECTS_LOG_DIR:-target/defects}
mkdir -p "$LOG_DIR"

# defect | package and test target | test name filter | what the failure must say
ROWS=(
    "skip-fence-check|-p shardwise-runtime --lib|owner::workers::tests::past_the_fence_no_reconcile_starts_and_the_work_stays_queued|reconciled past the fence"
    "write-after-fence|-p shardwise-runtime --lib|clients::tests::nothing_passes_the_fence_of_a_term_that_is_over|a request passed the fence of a term that is over"
    "write-after-fence|-p shardwise-runtime --lib|clients::tests::a_connection_writes_nothing_once_the_fence_has_closed|a connection wrote after the fence"
    "keep-working-after-handover|-p shardwise-runtime --lib|owner::gate::tests::a_drain_is_acknowledged_once_work_has_stopped|a record handed over (its drain acknowledged) admitted work"
    "renew-after-expiry|-p shardwise-runtime --test lease|a_lost_lease_is_taken_again_under_a_new_incarnation_after_it_expired|the same incarnation came back"
    "drop-destination-write|-p shardwise-e2e-suites --test e2e_controller|three_replicas_reconcile_the_whole_fleet_each_its_own_share|Synced without their content in the destination"
    "skip-balancer-refresh|-p shardwise-balancer --test balance|the_balancer_keeps_argocd_balanced_and_writes_only_shard_keys|apps refreshed"
    "skip-balancer-refresh|-p shardwise-balancer --test faults|moves_cut_off_before_their_refresh_are_refreshed_within_two_passes_of_the_faults_ending|0 apps refreshed"
    "skip-balancer-handover|-p shardwise-balancer --bin shardwise-balancer|pass::tests::moves_off_a_live_controller_are_handed_over_and_other_writes_are_not|written without a handover"
    "ignore-workload-changes|-p shardwise-balancer --test balance|a_scale_down_moves_the_leaving_shards_clusters_at_once_whatever_the_interval|the scale-down met at once"
    "balancer-key-above-pod-count|-p shardwise-balancer --bin shardwise-balancer|pass::tests::no_cluster_has_two_owners_at_any_step_of_a_rollout_up_and_down|is owned by two controllers"
    "restart-undrained-controller|-p shardwise-balancer --bin shardwise-balancer|replicas::tests::a_pod_is_replaced_only_once_it_holds_nothing_and_the_one_above_has_settled|is replaced while it still holds clusters"
    "restart-undrained-controller|-p shardwise-e2e-argocd --test e2e_argocd|with_manage_replicas_the_balancer_changes_the_count_pod_by_pod_and_no_app_goes_unowned|app-seconds without an owner beyond"
    "per-term-field-manager|-p shardwise-runtime --lib|clients::tests::a_terms_writes_name_the_programs_field_manager|a write named no field manager"
    "per-term-field-manager|-p shardwise-e2e-suites --test e2e_controller|scaling_moves_work_to_the_shards_that_exist|the apps' status managers"
    "trust-dynamic-count|-p shardwise-e2e-argocd --test e2e_argocd|under_dynamic_distribution_a_scale_without_restarts_gives_no_app_two_owners|the balancer wrote keys while pods that read them with the old count ran"
)

wanted=("$@")
failed=0
printf '| defect | test that caught it | time to catch |\n|---|---|---:|\n'
for row in "${ROWS[@]}"; do
    IFS='|' read -r defect target filter expected <<<"$row"
    if ((${#wanted[@]})) && [[ ! " ${wanted[*]} " =~ " ${defect} " ]]; then
        continue
    fi
    log="$LOG_DIR/${defect}-${filter##*::}.log"
    # Built first, untimed: the time to catch is the test's own.
    # shellcheck disable=SC2086
    if ! cargo test --locked $target --features "$FEATURE" --no-run >"$log" 2>&1; then
        echo "defects.sh: $defect: the build failed (see $log)" >&2
        failed=1
        continue
    fi
    started=$(date +%s%N)
    # shellcheck disable=SC2086
    FAILPOINTS="$defect=return" SHARDWISE_BUILD_FEATURES="$FEATURE" \
        cargo test --locked $target --features "$FEATURE" -- --exact "$filter" --nocapture \
        >>"$log" 2>&1
    status=$?
    took_ms=$((($(date +%s%N) - started) / 1000000))
    if ((status == 0)); then
        verdict="NOT CAUGHT (the test passed)"
        failed=1
    elif grep -qF -- "$expected" "$log"; then
        verdict="$((took_ms / 1000)).$((took_ms % 1000 / 100)) s"
    else
        verdict="NOT CAUGHT (failed without \"$expected\")"
        failed=1
    fi
    printf '| `%s` | `%s` | %s |\n' "$defect" "${filter##*::}" "$verdict"
done
exit "$failed"
