use super::*;

const SHAPE: EngineShape =
    EngineShape { block_size: 16, num_blocks: 11_000, max_num_seqs: 64, max_num_batched_tokens: 8192 };
const COST: StepCost = StepCost {
    base_ms: 36.0,
    prefill_ms_per_token: 0.42,
    decode_ms_per_seq: 0.35,
    attention_ms_per_ktoken: 0.05,
    request_ms: 0.0,
};

fn sent(id: u64, prompt_tokens: u32, max_tokens: u32) -> Sent {
    Sent { id, prompt_tokens, cached_tokens: 0, prefix: 0, max_tokens }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * a.abs().max(b.abs()).max(1.0)
}

#[test]
fn an_idle_engine_prefills_a_long_prompt_in_budget_sized_chunks() {
    let r = Replica::new(SHAPE, COST);
    // 16,256 tokens: 8,192 then 8,064, the second step attending to the whole prompt.
    let want = COST.ms(&StepWork { steps: 1.0, prefill_tokens: 8192.0, decode_seqs: 0.0, context_ktokens: 8.192 })
        + COST.ms(&StepWork { steps: 1.0, prefill_tokens: 8064.0, decode_seqs: 0.0, context_ktokens: 16.256 });
    let got = r.predict_ttft_ms(16_256, 0, 0, 0.0);
    assert!(close(got, want), "{got} vs {want}");
    let cached = r.predict_ttft_ms(16_256, 16_000, 7, 0.0);
    let want_cached =
        COST.ms(&StepWork { steps: 1.0, prefill_tokens: 256.0, decode_seqs: 0.0, context_ktokens: 16.256 });
    assert!(close(cached, want_cached), "{cached} vs {want_cached}");
}

#[test]
fn the_request_cost_is_added_once() {
    let r = Replica::new(SHAPE, StepCost { request_ms: 30.0, ..COST });
    let without = Replica::new(SHAPE, COST).predict_ttft_ms(100, 0, 0, 5.0);
    assert!(close(r.predict_ttft_ms(100, 0, 0, 5.0), without + 30.0));
}

#[test]
fn a_request_that_finds_no_blocks_waits_for_a_completion() {
    // Room for one 1,000-token request and its output, not two.
    let shape = EngineShape { num_blocks: 80, ..SHAPE };
    let mut r = Replica::new(shape, COST);
    r.dispatch(sent(1, 1_000, 50), 0.0);
    r.advance(1e-6);
    let blocked = r.predict_ttft_ms(1_000, 0, 0, 0.0);
    let roomy = {
        let mut r = Replica::new(SHAPE, COST);
        r.dispatch(sent(1, 1_000, 50), 0.0);
        r.advance(1e-6);
        r.predict_ttft_ms(1_000, 0, 0, 0.0)
    };
    // The blocked one waits for about 49 decode steps of the first request.
    assert!(blocked > roomy + 49.0 * COST.base_ms, "blocked {blocked} roomy {roomy}");
}

#[test]
fn requests_sharing_a_prefix_hold_its_blocks_once() {
    // A 1,600-token prefix (100 blocks) plus 16 tokens each: two holders fit in 110 blocks
    // only if the prefix is counted once.
    let shape = EngineShape { num_blocks: 110, ..SHAPE };
    let mut r = Replica::new(shape, COST);
    r.dispatch(Sent { id: 1, prompt_tokens: 1_616, cached_tokens: 1_600, prefix: 9, max_tokens: 4 }, 0.0);
    r.dispatch(Sent { id: 2, prompt_tokens: 1_616, cached_tokens: 1_600, prefix: 9, max_tokens: 4 }, 0.0);
    r.advance(1e-6);
    assert_eq!(r.counts(), (0, 2));
    let mut unshared = Replica::new(shape, COST);
    unshared.dispatch(Sent { id: 1, prompt_tokens: 1_616, cached_tokens: 1_600, prefix: 9, max_tokens: 4 }, 0.0);
    unshared.dispatch(Sent { id: 2, prompt_tokens: 1_616, cached_tokens: 1_600, prefix: 10, max_tokens: 4 }, 0.0);
    unshared.advance(1e-6);
    assert_eq!(unshared.counts(), (1, 1));
}

#[test]
fn a_batch_that_outgrows_the_cache_preempts_its_newest_member() {
    // Two 800-token requests fill 100 of 104 blocks; their outputs need more.
    let shape = EngineShape { num_blocks: 104, ..SHAPE };
    let mut r = Replica::new(shape, COST);
    r.dispatch(sent(1, 800, 200), 0.0);
    r.dispatch(sent(2, 800, 200), 0.0);
    r.advance(1e-6);
    assert_eq!(r.counts(), (0, 2));
    let mut preempted = false;
    for step in 1..400 {
        r.advance(f64::from(step) * 100.0);
        if r.counts().0 == 1 {
            preempted = true;
            break;
        }
    }
    assert!(preempted, "the newest request should have gone back to waiting");
    assert!(r.free_blocks() <= shape.num_blocks);
}

#[test]
fn a_lagging_replica_takes_the_first_token_it_is_shown_and_samples_the_work_left() {
    let mut r = Replica::new(SHAPE, StepCost { prefill_ms_per_token: 10.0, ..COST });
    r.dispatch(sent(1, 16_256, 10), 0.0);
    // In the replica the prompt needs ~160 s; the engine answered after 4 s.
    let s = r.started(1, 4_000.0).expect("a sample");
    assert!(s.first_token);
    assert!(close(s.observed_ms, 4_000.0));
    assert!(close(s.work.prefill_tokens, 16_256.0), "{:?}", s.work);
    assert!(close(s.work.steps, 2.0), "{:?}", s.work);
    // From now on it decodes: nine more tokens, then it is gone. Its typical step ran alone.
    let end = Ended { output_tokens: Some(10), median_gap_ms: Some(40.0) };
    let s = r.finished(1, &end, 5_000.0).expect("a sample");
    assert!(!s.first_token);
    assert!(close(s.observed_ms, 40.0));
    assert!(close(s.work.steps, 1.0) && close(s.work.decode_seqs, 1.0) && s.work.prefill_tokens == 0.0, "{:?}", s.work);
    assert_eq!(r.counts(), (0, 0));
    assert!(r.finished(1, &end, 5_001.0).is_none());
}

#[test]
fn a_replica_ahead_of_the_engine_keeps_what_it_simulated() {
    let mut r = Replica::new(SHAPE, COST);
    r.dispatch(sent(1, 1_000, 3), 0.0);
    r.advance(10_000.0);
    assert_eq!(r.counts(), (0, 0));
    let s = r.started(1, 10_000.0).expect("a sample");
    assert!(close(s.work.prefill_tokens, 1_000.0) && close(s.work.steps, 1.0), "{:?}", s.work);
    // Without the stream's gaps there is no step sample, but the request is dropped all the same.
    r.dispatch(sent(2, 1_000, 3), 10_000.0);
    assert!(r.finished(2, &Ended::default(), 10_001.0).is_none());
    assert_eq!(r.counts(), (0, 0));
    let s = r.finished(1, &Ended { output_tokens: Some(3), median_gap_ms: Some(37.0) }, 10_050.0).expect("a sample");
    assert!(close(s.work.steps, 1.0) && close(s.work.decode_seqs, 1.0), "{:?}", s.work);
}

#[test]
fn forgotten_requests_free_their_blocks() {
    let shape = EngineShape { num_blocks: 80, ..SHAPE };
    let mut r = Replica::new(shape, COST);
    r.dispatch(sent(1, 1_000, 500), 0.0);
    r.advance(1e-6);
    let before = r.predict_ttft_ms(1_000, 0, 0, 0.0);
    r.forget(1, 0.0);
    let after = r.predict_ttft_ms(1_000, 0, 0, 0.0);
    assert!(after < before / 10.0, "{after} vs {before}");
}

#[test]
fn degenerate_costs_and_shapes_give_finite_bounded_figures() {
    let bad = StepCost {
        base_ms: f64::NAN,
        prefill_ms_per_token: -1.0,
        decode_ms_per_seq: f64::INFINITY,
        attention_ms_per_ktoken: 0.0,
        request_ms: f64::NAN,
    };
    let mut r =
        Replica::new(EngineShape { block_size: 0, num_blocks: 0, max_num_seqs: 0, max_num_batched_tokens: 0 }, bad);
    for id in 0..50 {
        r.dispatch(sent(id, u32::MAX / 4, u32::MAX), 0.0);
    }
    r.advance(1e12);
    let t = r.predict_ttft_ms(u32::MAX, u32::MAX, 0, 1e12);
    assert!(t.is_finite() && t >= 0.0);
    assert!(r.started(3, 1e12).is_none_or(|s| s.observed_ms.is_finite()));
}

#[test]
fn the_learner_recovers_a_cost_three_times_off_its_prior() {
    let truth = StepCost { request_ms: 25.0, ..COST };
    let prior = StepCost {
        base_ms: truth.base_ms * 3.0,
        prefill_ms_per_token: truth.prefill_ms_per_token / 3.0,
        decode_ms_per_seq: truth.decode_ms_per_seq * 3.0,
        attention_ms_per_ktoken: truth.attention_ms_per_ktoken / 3.0,
        request_ms: 80.0,
    };
    let mut learner = CostLearner::new(prior);
    let mut rng = 12345u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % 1_000) as f64 / 1_000.0
    };
    for i in 0..2_000 {
        let first_token = i % 2 == 0;
        let steps = 1.0 + 40.0 * next();
        let work = StepWork {
            steps,
            // First tokens wait mostly for prefill, later tokens mostly for decode steps, with
            // another request's prompt chunk now and then.
            prefill_tokens: if first_token {
                16_000.0 * next() * steps / 10.0
            } else if next() < 0.3 {
                8_192.0 * next()
            } else {
                0.0
            },
            decode_seqs: steps * 30.0 * next(),
            context_ktokens: steps * 200.0 * next(),
        };
        let noise = 1.0 + 0.05 * (next() - 0.5);
        let observed_ms = (truth.ms(&work) + if first_token { truth.request_ms } else { 0.0 }) * noise;
        learner.observe(&Sample { work, first_token, observed_ms });
    }
    let got = learner.cost();
    let within = |a: f64, b: f64| (a / b - 1.0).abs() < 0.1;
    assert!(within(got.base_ms, truth.base_ms), "{got:?}");
    assert!(within(got.prefill_ms_per_token, truth.prefill_ms_per_token), "{got:?}");
    // Decode and attention are each a few percent of a sample: their sum is what is known.
    for (seqs, ktokens) in [(1.0, 2.0), (10.0, 160.0), (30.0, 100.0), (60.0, 400.0)] {
        let step = StepWork { steps: 1.0, prefill_tokens: 0.0, decode_seqs: seqs, context_ktokens: ktokens };
        assert!((got.ms(&step) / truth.ms(&step) - 1.0).abs() < 0.05, "{step:?}: {got:?}");
    }
    assert_eq!(learner.samples(), 2_000);
}

#[test]
fn the_learner_ignores_samples_without_time_or_work() {
    let mut learner = CostLearner::new(COST);
    let before = learner.clone();
    learner.observe(&Sample { work: StepWork::default(), first_token: true, observed_ms: 100.0 });
    learner.observe(&Sample {
        work: StepWork { steps: 1.0, ..StepWork::default() },
        first_token: false,
        observed_ms: f64::NAN,
    });
    learner.observe(&Sample {
        work: StepWork { steps: 1.0, ..StepWork::default() },
        first_token: false,
        observed_ms: 0.0,
    });
    assert_eq!(learner, before);
}
