"""The trace is immutable: an event is final when emitted, a snapshot stays as it was taken, and
hand-written traces (TraceBuilder) get the same keys as recorded ones (graddoctor/events.py)."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import pickle

import pytest
import torch
from torch import nn

from graddoctor import events as ev
from graddoctor.run.interim import snapshot as _snapshot
from graddoctor.run.session import run_check
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.recorder import Deferred
from graddoctor.options import CheckOptions
from graddoctor.trace import Event, Location, Trace, TraceBuilder

from fixture_runs import fixture_options, keep_for

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")
# between them every kind the fixtures record (AMP, clipping, schedulers, loaders, modes)
COVERING = ["amp_clip_accum/good_amp_accumulation.py", "modes/good_adapter_frozen_encoder_eval.py",
            "modes/good_recalibrate_reset_running_stats.py", "modes/good_swa_update_bn.py",
            "modes/bad_functional_dropout_validation.py", "losses/bad_loss_broadcast_column_output.py",
            "losses/bad_loss_input_softmax_module.py",  # loss_input
            "losses/bad_class_weights_uniform_bce_scalar.py",  # uniform_weight
            "registration/bad_snapshot_best_state_sliced_batches.py",  # phase_hold
            "losses/bad_target_domain_soft_margin_zero_one.py",  # target_domain
            "zero_grad/bad_param_without_grad_head_under_no_grad.py",
            "zero_grad/bad_param_without_grad_loss_item.py",  # idle_loss
            "zero_grad/bad_param_without_grad_critic_detached.py",  # idle_detach
            "tbptt/good_retain_graph_growing_sequences.py",  # torch.autograd.grad: functional_grad
            "distributed/bad_sampler_without_set_epoch.py",
            "zero_grad/bad_optimizer_lr_attribute.py",  # optimizer_attr
            "registration/bad_module_requires_grad_attribute.py",  # module_attr
            "registration/bad_param_requires_grad_method_shadowed.py",  # param_attr
            "registration/bad_state_loaded_then_reset_parameters.py",  # state_overwritten
            "registration/bad_submodules_in_plain_list.py",  # unregistered
            "data/bad_reseed_helper_every_batch.py",  # reseed
            "autograd/bad_hook_stacked_grad_scale.py",  # hook_stacked
            "data/bad_labels_one_value_rates_cast.py",  # constant_targets
            "data/bad_sampler_reach_label_weights.py",  # loader_sampler
            "autograd/bad_custom_backward_swapped_grads.py",  # custom_backward
            "losses/bad_loss_counts_padding_nll.py",  # loss_padding
            "losses/bad_real_index_ignored_tagger.py",  # real_index
            "data/bad_embedding_fields_time_features.py",  # field_rows
            "autograd/bad_aggregate_column_sums_inline.py",  # aggregate_sum
            "autograd/bad_adjacency_scaled_by_degree_gcn.py",  # degree_scaled
            "autograd/bad_messages_sent_back_to_source_sage.py",  # self_scatter
            "autograd/bad_attention_over_all_edges_multihead.py",  # softmax_over_edges
            "data/bad_bag_offsets_not_cumulative_text.py",  # bag_offsets
            "autograd/bad_edges_across_batched_graphs_gin.py",  # edges_across_graphs
            "losses/bad_policy_gradient_reversed_a2c.py",  # policy_sign
            "dependency/bad_target_visible_seq_first_lm.py",  # token_copy
            "losses/bad_token_labels_shifted_extra_slot_bilstm.py",  # token_labels_shifted
            "numerics/bad_low_precision_bf16_frozen.py",  # low_precision
            "autograd/bad_graph_kept_smoothed_loss.py",  # graph_kept
            "registration/bad_param_replaced_submodule_after_optimizer.py",  # param_replaced
            "zero_grad/bad_params_reset_load_state_dict.py",  # param_reset
            "zero_grad/bad_hand_update_without_zero_grad.py",  # backward's hand-update fields
            "autograd/bad_grads_zero_round_quantize.py",  # grad_stops
            "registration/bad_snapshot_best_state_restored.py",  # snapshot_alias
            "data/bad_batch_first_transformer_synthetic.py",  # batch_layout
            "distributed/good_single_rank_group_loader.py",  # batch_fingerprint
            "data/bad_unshuffled_sorted_image_folder.py",  # batch_labels
            "data/bad_unshuffled_sorted_regression.py",  # batch_spread
            "registration/bad_linear_layers_collapse_sequential.py",  # linear_stack
            "registration/bad_layer_built_in_forward.py",  # param_created
            "data/bad_loaders_shuffled_apart.py",  # loaders_zipped
            "data/bad_labels_of_another_batch.py",  # batch_pairing
            "data/bad_dataset_drifts_noise_in_place.py",  # dataset_drift
            "data/bad_label_of_another_sample_next_row.py",  # label_offset
            "data/bad_augmentation_misaligned_flip_axis.py",  # augment_misaligned
            "data/bad_labels_remapped_void_where.py",  # target_remapped
            "dense/bad_label_map_interpolated_area.py",  # label_map_averaged
            "data/bad_collate_reorders_fields_argsort.py",  # collate_reordered
            "data/bad_trains_on_evaluation_data_splits_overlap.py",  # loader_rows
            "data/bad_last_step_is_padding.py",  # last_step_padded
            "data/bad_summary_before_sequence_end.py",  # causal_read_early
            "data/bad_recurrent_state_across_shuffled_batches.py",  # state_carried
            "data/bad_pixels_not_scaled.py",  # pixels_unscaled
            "data/bad_pixels_scaled_twice.py",  # pixels_scaled_twice
            "dense/bad_grid_not_normalised_flow_pixels.py",  # grid_scale
            "dense/bad_placeholder_targets_sparse_depth.py",  # placeholder_targets
            "dense/bad_pooled_over_channels_gap.py",  # channel_pool
            "numerics/bad_normaliser_changes_sign_linear_attention_encoder.py",  # normaliser_sign
            "masks/bad_attention_prefers_distant_keys_bloom_bias.py",  # distance_bias
            "dependency/bad_prefix_sum_off_positions_gated_decay.py",  # cumulative_axis
            "losses/bad_hard_samples_pushed_up_sigmoid_focal_anchors.py",  # easy_weighted
            "losses/bad_overlap_on_raw_scores_unet_dice.py",  # overlap_scores
            "losses/bad_down_weighted_class_never_targeted_new_track.py",  # weighted_class_absent
            "dense/bad_loss_on_ignored_pixels_soft_iou.py",  # ignored_mask
            "masks/bad_mask_keeps_padding_token_loss.py",  # padding_kept
            "masks/bad_mean_pools_padding_gru.py",  # padding_pooled
            "dense/bad_cells_read_transposed_centernet.py",  # cells_transposed
            "losses/bad_dropout_on_output.py",  # dropout_on_output
            "losses/bad_sample_weights_broadcast_bce.py",  # factor_broadcast
            "masks/bad_attention_mask_inverted_key_padding.py",  # attention_mask
            "losses/bad_label_smoothing_twice_hand_smoothed.py",  # label_smoothing
            "data/bad_mixup_labels_unmixed.py",  # mixup_unmixed
            "registration/bad_repeated_layer_module_list.py",  # module_repeated
            "distributed/good_single_rank_allreduce.py",  # grad_allreduce
            "autograd/bad_symmetric_units_constant_init.py",  # symmetric_units
            "autograd/bad_copies_twin_critics.py",  # copies_identical
            "losses/bad_loss_weight_from_loss_focal_bce.py",  # loss_derived_weight
            "losses/bad_hard_samples_pushed_up_focal.py",  # samples_pushed_up
            "masks/bad_mask_applied_once_pixelcnn.py",  # mask_regrown
            "masks/bad_autoregressive_mask_rows_below_kept.py",  # mask_not_causal
            "constraints/bad_constraint_before_step_clamp.py",  # constraint_broken
            "autograd/bad_straight_through_vq_codebook.py",  # straight_through_cancelled
            "registration/bad_state_dict_not_loaded_module_prefix.py",  # state_not_loaded
            "modes/bad_batchnorm_keras_momentum.py",  # norm_arguments
            "numerics/bad_updates_diverge_summed_loss.py",  # diverging
            "losses/bad_output_range_sigmoid_prices.py",  # output_range
            "losses/bad_generator_helps_wgan_sign.py",  # gan_same_target
            "losses/bad_entropy_minimised_ppo.py",  # entropy_sign
            "losses/bad_target_not_detached_dqn.py",  # target_grad
            "losses/bad_target_reduced_over_batch_dqn.py",  # batch_reduced_target
            "losses/bad_noise_target_redrawn.py",  # noise_redrawn
            "losses/bad_cumulative_cox_shuffled.py",  # cumulative_order
            "losses/bad_returns_reversed_sparse.py",  # returns_order
            "losses/bad_conditioning_drawn_twice_concat.py",  # draw_twin
            "masks/bad_softmax_wrong_axis_queries.py",  # softmax_axis
            "masks/bad_attention_scores_multiplied_sqrt.py",  # attention_scale
            "masks/bad_masked_fill_zero_pooling.py",  # masked_fill_weight
            "tbptt/bad_stream_interleaved_batchify_seq_first.py",  # stream_interleaved
            "losses/bad_contrastive_temperature_multiplied_infonce.py",  # temperature_multiplied
            "dependency/bad_view_reorders_axes_encoder_features.py",  # view_axes
            "dependency/bad_loss_rows_misaligned_forecast_mse.py",  # rows_misaligned
            "data/bad_rows_shuffled_apart_lists.py",  # shuffled_apart
            "data/bad_input_written_full_batch.py",  # input_written
            "losses/bad_loss_term_repeated_mixup.py",  # loss_repeated
            "losses/bad_loss_term_repeated_chamfer_direction.py",  # term_repeated
            "masks/bad_masked_mean_counts_padding_tokens.py",  # masked_mean
            "masks/bad_masked_target_visible_node_features.py",  # masked_visible
            "masks/bad_restore_not_inverse_series_mae.py",  # unshuffle_misplaced
            "numerics/bad_eps_adam_one.py",  # eps_share
            "numerics/bad_activations_tanh_init.py",  # activation_saturated
            "amp_clip_accum/good_scaler_rebuilt_lookalikes.py",  # scaler_load
            "losses/bad_anchor_aliases_params_l2sp.py",  # anchor_alias
            "zero_grad/bad_grads_accumulated_across_weight_edit_sam.py",  # weights_edited
            "zero_grad/bad_perturbation_not_undone_sam_function.py",  # weights_edit_kept
            "registration/bad_weight_copy_aliases_params_lookahead.py",  # self_copy
            "autograd/bad_grad_graph_unused_penalty.py",  # grad_graph_unused
            "losses/bad_loss_compares_with_itself_bpr.py",  # same_compared
            "losses/bad_loss_unbounded_kl_sign.py",  # loss_unbounded
            "losses/bad_orthogonality_without_transpose_weight.py",  # self_product_offset
            "losses/bad_loss_term_concave_where.py",  # concave_term
            "losses/bad_log_det_sign_reversed_coupling.py",  # log_scale_reversed
            "masks/bad_autoregressive_mask_made_output_loose.py",  # mask_sees_itself
            "losses/bad_log_det_misses_positions_actnorm.py",  # log_det_positions
            "losses/bad_flow_dimension_untransformed_halves.py",  # flow_identity_dims
            "losses/bad_sampled_negatives_pushed_up_bpr.py",  # sampled_scores
            "losses/bad_embedding_normalised_across_rows_cosine_items.py",  # table_columns_unit
            "losses/bad_loss_weight_kendall_unregularised.py",  # loss_weight_learned
            "losses/bad_mixed_reduction_betavae.py",  # batch_reduction
            "losses/bad_loss_term_constant_normalized_norm.py",  # constant_term
            "data/bad_gan_range_unit_data_tanh.py",  # sample_range
            "losses/bad_kl_weight_integer_division.py",  # zero_weight
            "losses/bad_label_smoothing_confidence.py",  # smoothing_high
            "losses/bad_advantage_not_detached_a2c.py",  # advantage_grad
            "losses/bad_importance_ratio_wrong_old_is_new.py",  # ratio_fault
            "losses/bad_sample_not_reparameterised_vae.py",  # reparam_cut
            "losses/bad_log_prob_of_fresh_sample_batch.py",  # fresh_sample_scored
            "autograd/bad_loss_term_detached.py",  # loss_no_graph
            "losses/bad_class_weights_inverted_ce.py",  # class_weights
            "data/bad_target_column_in_inputs.py",  # target_in_inputs
            "losses/bad_similarity_diagonal_unmasked_simclr.py",  # self_match
            "losses/bad_contrastive_positive_misplaced_infonce_zeros.py",  # pair_labels
            "distributed/bad_ddp_forward_bypassed_single_rank.py",  # ddp_init
            "registration/bad_param_stepped_twice_nn_parameter_tie.py",  # optimizer_init's aliases
            "losses/bad_softmax_over_batch_dice.py",  # softmax_batch
            "losses/bad_reduced_over_batch_hinge.py",  # reduce_batch
            "losses/bad_gather_over_batch_dqn.py",  # gather_batch
            "losses/bad_loss_maximised_hand_written_nll.py",  # loglik_minimised
            "losses/bad_ordinal_level_always_on_coral.py",  # ordinal_shifted
            "losses/bad_weights_on_reduced_loss_mask.py",  # weighted_reduced
            "losses/bad_class_axis_mismatch_tagger.py",  # class_axis
            "losses/bad_logit_shift_cancels_amsoftmax.py",  # shift_cancelled
            "losses/bad_pair_pull_reversed_batch_hard.py",  # pair_pull
            "losses/bad_norm_over_batch_unit_norm_mse.py",  # norm_batch
            "losses/bad_variance_across_features_vicreg.py",  # feature_variance
            "losses/bad_loss_is_batch_spread_compactness.py",  # spread_minimised
            "masks/bad_prompt_mask_inverted_comparison.py"]  # prompt_trained

# their tests/test_fixtures.py tests read the runs made here (conftest orders them after these)
FIXTURE_RUNS_HELD = COVERING

GRAD_EDIT_SCRIPT = """
import torch
from torch import nn
model = nn.Linear(3, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    optimizer.zero_grad()
    model(torch.randn(4, 3)).sum().backward()
    for p in model.parameters():
        p.grad /= 2  # an edit graddoctor does not watch: a grad_edit event
    optimizer.step()
"""


def dumped(event: Event) -> str:
    return json.dumps(event.to_json(), default=repr, sort_keys=True)


@pytest.fixture(scope="module")
def covering_runs(tmp_path_factory):
    """Every COVERING fixture and GRAD_EDIT_SCRIPT (also with a picture asked for: the grad_flow
    events too) checked once, with every event put into any trace and its JSON at that moment:
    the runs the tests below assert different things about, as (reports, every run's
    (event, JSON) in order, each run's own list). A fixture is checked as
    tests/test_fixtures.py checks it (from its folder, with its marks' options), and its run is
    held for that test (tests/fixture_runs.py; conftest puts those tests right after this
    module's), which reads it instead of checking the fixture again."""
    script = tmp_path_factory.mktemp("grad_edit") / "grad_edit.py"
    script.write_text(GRAD_EDIT_SCRIPT)
    log: list[tuple[Event, str]] = []
    put = Trace.put

    def recording_put(self, made, loc=None):
        event = put(self, made, loc)
        log.append((event, dumped(event)))
        return event

    reports, runs = [], []

    def record(run):
        start = len(log)
        reports.append(run())
        runs.append(log[start:])

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Trace, "put", recording_put)
        for p in COVERING:
            path = os.path.join(FIXTURES, p)
            patch.chdir(os.path.dirname(path))
            options = fixture_options(path)
            record(lambda: run_check(options))
            keep_for(options, reports[-1])
        patch.undo()  # the working directory back before the grad-edit script's runs
        patch.setattr(Trace, "put", recording_put)
        record(lambda: check(str(script)))
        record(lambda: check(str(script), grad_flow=True))
    return reports, log, runs


def check(path: str, **options):
    return run_check(CheckOptions(target=path, **options))


# -- read-only events ------------------------------------------------------------------------
def test_mutating_an_event_raises():
    trace = Trace()
    event = trace.put(ev.backward(fresh=[0], accumulated=[], cleared_outside=[]), Location("t.py", 3))
    added = trace.add("custom", None, value=1)
    for e in (event, added):
        with pytest.raises(TypeError):
            e.data["fresh"] = [1]
        with pytest.raises(TypeError):
            del e.data[next(iter(e.data))]
        with pytest.raises(AttributeError):
            e.data.update(x=1)
        with pytest.raises(dataclasses.FrozenInstanceError):
            e.data = {}  # type: ignore[misc]
    made = Event(0, "custom", None, {"a": [1]})  # a plain dict given: copied, then read-only
    with pytest.raises(TypeError):
        made.data["a"] = 2


def test_recorded_events_are_read_only_and_keep_their_json_form(covering_runs):
    report = covering_runs[0][0]
    trace = report.trace
    for event in trace:
        with pytest.raises(TypeError):
            event.data["seq"] = 0
    again = Trace.loads(trace.dumps())
    assert again.dumps() == trace.dumps()
    assert [dict(e.data) for e in again][:5] == [json.loads(json.dumps(dict(e.data))) for e in trace][:5]
    first = trace.events[1]
    assert copy.deepcopy(first) == first and pickle.loads(pickle.dumps(first)) == first


def test_no_event_changes_after_it_is_emitted(covering_runs):
    """Aggregates grow inside their watcher and are emitted finished; device values are read
    into new events of the final trace; the rules read the trace without changing it."""
    reports, emitted, _ = covering_runs
    assert not any(r.internal_errors for r in reports)
    changed = [(e.seq, e.kind, then, dumped(e)) for e, then in emitted if dumped(e) != then]
    assert not changed, changed[:3]
    assert {e.kind for e, _ in emitted} >= {"mode_forward", "train", "eval", "freeze", "bn_reset",
                                             "grad_edit", "scaler_update"}


def test_deferred_values_are_read_into_new_events_of_the_final_trace(covering_runs):
    reports, _, runs = covering_runs
    report, emitted = reports[0], runs[0]  # COVERING[0]: GradScaler, scales are device values
    recorded = [e for e, _ in emitted if any(isinstance(v, Deferred) for v in e.data.values())]
    assert {e.kind for e in recorded} >= {"backward", "unscale", "scaler_update"}
    final = report.trace.events
    for event in recorded:
        now = final[event.seq]
        assert now is not event and (now.seq, now.kind, now.loc) == (event.seq, event.kind, event.loc)
        assert isinstance(now["scale"], float) and isinstance(event["scale"], Deferred)
    assert not any(isinstance(v, Deferred) for e in final for v in e.data.values())


# -- snapshots -----------------------------------------------------------------------------------
def test_a_snapshot_taken_mid_run_is_not_changed_by_later_events():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.1), nn.Linear(4, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu")
        x = torch.randn(8, 4)

        def infer(times):
            with torch.no_grad():
                for _ in range(times):
                    model(x)  # one call line: one mode_forward aggregate while nothing else happens

        optimizer.zero_grad()
        scaler.scale(model(x).sum()).backward()  # a backward holding a Deferred scale
        model.eval()
        infer(3)  # the aggregate is still open
        snap = _snapshot(rec)
        text = snap.dumps()
        live = list(rec.trace.events)
        infer(2)  # the same aggregate grows
        model.train()
        scaler.scale(model(x).sum()).backward()
        scaler.step(optimizer)
        scaler.update()
    assert snap.dumps() == text
    assert snap.events is not rec.trace.events
    final = rec.trace.events
    [held] = [e for e in snap if e.kind == "mode_forward" and not e["training"]]
    assert held.seq >= len(live)  # not emitted when the snapshot was taken: copied as it was
    assert held["calls"] == 3 and final[held.seq] is not held
    assert (final[held.seq].kind, final[held.seq]["calls"]) == ("mode_forward", 5)
    assert final[held.seq]["modules"] == held["modules"]
    [backward] = [e for e in snap if e.kind == "backward"]
    assert isinstance(backward["scale"], Deferred) and '"scale": "unread"' in text
    assert final[backward.seq]["scale"] == 65536.0
    shapes = {e["pid"]: e["shape"] for e in snap if e.kind == "param"}
    assert all(shapes[e["pid"]] is not e["shape"] for e in final if e.kind == "param")


def test_held_events_get_the_seqs_and_order_they_would_have_had():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        model = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5), nn.Linear(2, 2), nn.Dropout(0.5))
        model.eval()
        for m in (model[1], model[3]):
            m.eval()  # per-layer calls from one line: merged into one eval event
        model(torch.randn(1, 2))
        emitted = len(rec.trace)
        held = rec.snapshot().events[emitted:]
        # a module's facts come at its first forward: after the aggregate it joins
        assert [e.kind for e in held] == ["eval", "eval", "mode_module", "mode_forward", "mode_module"]
        assert [e.seq for e in held] == list(range(emitted, emitted + 5))
        assert (held[1]["calls"], held[1]["modules"], held[3]["modules"]) == (2, [0, 1], [0, 1])
        rec.internal_error("test", RuntimeError("x"))  # any other event closes them first
        error = (emitted + 5, "internal_error", {"where": "test", "error": "RuntimeError: x"})
        assert [(e.seq, e.kind, dict(e.data)) for e in rec.trace.events[emitted:]] \
            == [(e.seq, e.kind, dict(e.data)) for e in held] + [error]


# -- one constructor per kind: recorded and hand-written events agree -----------------------------
def test_recorded_events_are_what_their_constructor_makes(covering_runs):
    _, emitted, _ = covering_runs
    kinds = set()
    for event, _ in emitted:
        kinds.add(event.kind)
        kind, data = ev.CONSTRUCTORS[event.kind](**event.data)
        assert kind == event.kind and list(data) == list(event.data), event
    # every kind but these (``folded`` only comes in long runs: tests/test_fold.py;
    # ddp_no_sync needs two ranks: the DDP fixtures of test_distributed.py)
    assert set(ev.CONSTRUCTORS) - kinds == {"compile", "internal_error", "folded",
                                            "ddp_no_sync", "replica_checksum"}


def test_trace_builder_makes_the_keys_the_instrumentation_makes(covering_runs):
    _, _, runs = covering_runs
    emitted = runs[0] + runs[1]  # COVERING[0]'s scaled backwards, COVERING[1]'s plain ones
    recorded: dict[str, list[set]] = {}
    for event, _ in emitted:
        keys = set(event.data)
        if keys not in recorded.setdefault(event.kind, []):
            recorded[event.kind].append(keys)
    t = TraceBuilder()
    t.optimizer(0, [0, 1])
    built = [t.backward(fresh=[0]), t.backward(accumulated=[0], scaled=True, scale=2.0, scaler=0,
                                               scaler_enabled=True),
             t.clear([0, 1]), t.step(0), t.trace.params()[0], t.trace.of_kind("optimizer_init")[0]]
    for event in built:
        assert set(event.data) in recorded[event.kind], (event.kind, recorded[event.kind])
    assert len(recorded["backward"]) == 2  # scaled ones add scaler and scaler_enabled


def test_constructors_take_only_their_own_keys():
    with pytest.raises(TypeError):
        ev.backward(bid=0, fresh=[], accumulated=[], cleared_outside=[])  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        ev.step(0)  # type: ignore[misc]  (keyword-only)
    assert ev.step(opt=0) == ("step", {"opt": 0, "closure": False, "skipped": False,
                                       "without_grad": []})
