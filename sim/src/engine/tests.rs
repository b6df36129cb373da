use super::*;
use crate::profile::{StepTiming, TINY};

fn profile(blocks: u32) -> Profile {
    Profile {
        num_gpu_blocks: blocks,
        block_size: 4,
        max_num_seqs: 8,
        max_num_batched_tokens: 64,
        timing: StepTiming {
            base_ms: 1.0,
            prefill_ms_per_token: 0.1,
            decode_ms_per_seq: 0.01,
            attention_ms_per_ktoken: 0.0,
        },
        ..TINY
    }
}

fn engine(blocks: u32) -> Engine {
    Engine::new(profile(blocks), 7, 1, Arc::new(vec![1000, 1001, 1002]))
}

/// Runs until `id` has produced its first token; returns (elapsed ms, events seen).
fn run_to_first_token(e: &mut Engine, id: RequestId) -> (f64, Vec<KvEvent>) {
    let mut elapsed = 0.0;
    let mut events = Vec::new();
    while let Some(out) = e.step() {
        elapsed += out.duration_ms;
        events.extend(out.events);
        if out.tokens.iter().any(|t| t.request == id) {
            return (elapsed, events);
        }
    }
    panic!("request {id} never produced a token");
}

fn drain(e: &mut Engine) -> Vec<KvEvent> {
    let mut events = Vec::new();
    while let Some(out) = e.step() {
        events.extend(out.events);
    }
    events
}

fn stored_tokens(events: &[KvEvent]) -> Vec<u32> {
    events
        .iter()
        .filter_map(|e| match e {
            KvEvent::BlockStored { token_ids, .. } => Some(token_ids.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

#[test]
fn repeated_prompt_hits_the_prefix_cache_and_is_faster() {
    let mut e = engine(64);
    let prompt: Vec<u32> = (1..=42).collect();
    let a = e.add_request(prompt.clone(), 3);
    let (cold, events) = run_to_first_token(&mut e, a);
    // 42 tokens = 10 full blocks of 4; all announced, in order, with their tokens.
    assert_eq!(stored_tokens(&events), prompt[..40].to_vec());
    drain(&mut e);
    assert_eq!(e.cached_prefix_tokens(&prompt), 40);
    let b = e.add_request(prompt.clone(), 3);
    let (warm, _) = run_to_first_token(&mut e, b);
    assert_eq!(e.cached_prompt_tokens(b), Some(40));
    assert!(warm < cold, "warm {warm} ms should beat cold {cold} ms");
    let c = e.counters();
    assert_eq!((c.prefix_cache_queries, c.prefix_cache_hits), (84, 40));
}

#[test]
fn the_last_prompt_token_is_always_recomputed() {
    let mut e = engine(64);
    let prompt: Vec<u32> = (1..=16).collect();
    let a = e.add_request(prompt.clone(), 1);
    drain(&mut e);
    assert_eq!(e.cached_prefix_tokens(&prompt), 12, "4 full blocks, but the last one holds the last token");
    let b = e.add_request(prompt, 2);
    run_to_first_token(&mut e, b);
    assert_eq!(e.cached_prompt_tokens(b), Some(12));
    let _ = a;
}

#[test]
fn parent_hashes_chain_stored_blocks() {
    let mut e = engine(64);
    let prompt: Vec<u32> = (1..=200).collect(); // 200 tokens, budget 64 → chunked prefill
    let a = e.add_request(prompt.clone(), 2);
    let (_, events) = run_to_first_token(&mut e, a);
    let stored: Vec<(&Vec<u64>, &Option<u64>)> = events
        .iter()
        .filter_map(|ev| match ev {
            KvEvent::BlockStored { block_hashes, parent_block_hash, .. } => Some((block_hashes, parent_block_hash)),
            _ => None,
        })
        .collect();
    assert!(stored.len() >= 4, "a chunked prefill stores blocks over several steps: {}", stored.len());
    assert_eq!(stored[0].1, &None);
    for w in stored.windows(2) {
        assert_eq!(w[1].1.as_ref(), w[0].0.last(), "each event's parent is the previous block");
    }
    assert_eq!(stored_tokens(&events), prompt);
}

#[test]
fn eviction_emits_block_removed_and_loses_cached_prefix() {
    let mut e = engine(16); // 64 tokens of cache
    let first: Vec<u32> = (1..=40).collect();
    let a = e.add_request(first.clone(), 1);
    drain(&mut e);
    assert_eq!(e.cached_prefix_tokens(&first), 36);
    let other: Vec<u32> = (500..560).collect();
    e.add_request(other, 1);
    let events = drain(&mut e);
    let removed: usize = events
        .iter()
        .map(|ev| match ev {
            KvEvent::BlockRemoved { block_hashes } => block_hashes.len(),
            _ => 0,
        })
        .sum();
    assert!(removed >= 9, "filling the cache evicts the first prompt's blocks ({removed} removed)");
    assert!(e.cached_prefix_tokens(&first) < 36);
    let _ = a;
}

#[test]
fn preemption_recovers_and_everything_finishes() {
    let mut e = engine(12); // 48 tokens for 4 requests of 12 + 20 outputs each
    let ids: Vec<RequestId> = (0..4).map(|i| e.add_request((i * 100..i * 100 + 12).collect(), 20)).collect();
    let mut finished = 0;
    let mut preempted = 0;
    let mut steps = 0;
    while let Some(out) = e.step() {
        steps += 1;
        preempted += out.preempted;
        finished += out.tokens.iter().filter(|t| t.finished).count();
        assert!(steps < 10_000);
    }
    assert_eq!(finished, ids.len());
    assert!(preempted > 0, "the cache is too small to run all four at once");
    assert_eq!(e.stats().kv_usage, 0.0);
}

#[test]
fn outputs_are_deterministic_and_respect_max_tokens() {
    let run = || {
        let mut e = engine(64);
        let id = e.add_request(vec![5; 30], 7);
        let mut toks = Vec::new();
        let mut durations = Vec::new();
        while let Some(out) = e.step() {
            durations.push(out.duration_ms);
            toks.extend(out.tokens.into_iter().filter(|t| t.request == id).map(|t| (t.token, t.index, t.finished)));
        }
        (toks, durations)
    };
    let (a, da) = run();
    assert_eq!((a.clone(), da), run());
    assert_eq!(a.len(), 7);
    assert!(a.iter().all(|(t, _, _)| (1000..=1002).contains(t)));
    assert!(a[6].2 && !a[5].2);
}

#[test]
fn predicted_ttft_equals_the_simulated_one() {
    let mut e = engine(64);
    e.add_request((1..=100).collect(), 50);
    e.step();
    let probe: Vec<u32> = (300..380).collect();
    let predicted = e.predict_ttft_ms(&probe);
    let id = e.add_request(probe, 1);
    let (actual, _) = run_to_first_token(&mut e, id);
    assert!((predicted - actual).abs() < 1e-9, "{predicted} vs {actual}");
}

#[test]
fn abort_frees_blocks() {
    let mut e = engine(64);
    let id = e.add_request((1..=30).collect(), 100);
    e.step();
    assert!(e.stats().kv_usage > 0.0);
    e.abort(id);
    assert_eq!(e.stats().kv_usage, 0.0);
    assert!(!e.has_work());
}

/// Over random workloads, a subscriber that applies the engine's events to a set of hashes
/// always holds exactly the engine's cached blocks, and every request finishes.
#[test]
fn events_track_the_cache_exactly_under_random_load() {
    use std::collections::HashSet;
    for seed in 0..40u64 {
        let mut e = Engine::new(profile(48), seed, seed, Arc::new(vec![7, 8, 9]));
        let mut rng = seed.wrapping_add(1);
        let mut next = move || {
            rng = mix(rng);
            rng
        };
        let mut view: HashSet<u64> = HashSet::new();
        let mut submitted = 0;
        let mut finished = 0;
        for step in 0..3000 {
            if step % 3 == 0 && submitted < 60 {
                // Prompts share one of 4 prefixes so the cache is reused and evicted.
                let prefix = (next() % 4) as u32;
                let mut p: Vec<u32> = (0..(next() % 40) as u32).map(|i| prefix * 1000 + i).collect();
                p.extend((0..1 + next() % 20).map(|_| (next() % 50_000) as u32));
                e.add_request(p, 1 + (next() % 12) as u32);
                submitted += 1;
            }
            let Some(out) = e.step() else { continue };
            finished += out.tokens.iter().filter(|t| t.finished).count();
            for ev in out.events {
                match ev {
                    KvEvent::BlockStored { block_hashes, .. } => {
                        for h in block_hashes {
                            assert!(view.insert(h), "seed {seed}: block stored twice without removal");
                        }
                    }
                    KvEvent::BlockRemoved { block_hashes } => {
                        for h in block_hashes {
                            assert!(view.remove(&h), "seed {seed}: removal of a block never stored");
                        }
                    }
                    KvEvent::AllBlocksCleared => view.clear(),
                }
            }
            assert_eq!(view.len(), e.stats().cached_blocks as usize, "seed {seed}: subscriber view diverged");
            let u = e.stats().kv_usage;
            assert!((0.0..=1.0).contains(&u));
        }
        assert_eq!(finished, submitted, "seed {seed}: every request finishes");
    }
}

#[test]
fn forced_output_is_emitted_in_order_and_cached() {
    let mut e = engine(64);
    let forced: Arc<[u32]> = vec![7, 8, 9, 10, 11, 12].into();
    let id = e.add_request_with_output((1..=10).collect(), 100, Some(forced.clone()));
    let mut got = Vec::new();
    let mut events = Vec::new();
    while let Some(out) = e.step() {
        events.extend(out.events);
        for t in out.tokens.iter().filter(|t| t.request == id) {
            got.push((t.token, t.finished));
        }
    }
    let tokens: Vec<u32> = got.iter().map(|g| g.0).collect();
    assert_eq!(tokens, forced.to_vec(), "the forced tokens, then the request finishes");
    assert_eq!(got.iter().filter(|g| g.1).count(), 1);
    assert!(got.last().is_some_and(|g| g.1));
    // Output tokens fill blocks like sampled ones: 10 prompt tokens and the first 5 outputs are
    // computed (the last output never is), so three full blocks of 4 enter the cache.
    let computed: Vec<u32> = (1..=10).chain(7..=11).collect();
    assert_eq!(stored_tokens(&events), computed[..12]);

    // max_tokens still cuts a forced output short.
    let id = e.add_request_with_output(vec![3; 9], 2, Some(forced.clone()));
    let mut cut = Vec::new();
    while let Some(out) = e.step() {
        cut.extend(out.tokens.iter().filter(|t| t.request == id).map(|t| t.token));
    }
    assert_eq!(cut, [7, 8]);
}
