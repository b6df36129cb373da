//! Exactness of the chunked encode against the full `tokenizers` encode, and its cost.

use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use serde_json::{Value, json};
use tokenizers::{AddedToken, Tokenizer};

use super::*;
use crate::{EngineTokenizer, SEGMENT_VERIFY};

fn shipped_json() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("files/tokenizer.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("reads")).expect("parses")
}

fn from_json(v: &Value) -> Tokenizer {
    Tokenizer::from_bytes(serde_json::to_vec(v).expect("serializes")).expect("loads")
}

/// The shipped tokenizer.
fn shipped() -> Tokenizer {
    from_json(&shipped_json())
}

fn gpt2_pre_tokenizer() -> Value {
    json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true})
}

fn llama3_pre_tokenizer() -> Value {
    json!({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated", "invert": false},
        {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
    ]})
}

/// The shipped vocabulary behind the Llama-3 pre-tokenizer (Split regex + regex-free ByteLevel).
fn llama3() -> Tokenizer {
    let mut v = shipped_json();
    v["pre_tokenizer"] = llama3_pre_tokenizer();
    from_json(&v)
}

/// A byte-level BPE trained on the test alphabet with no pre-tokenization at all, so it has
/// merges across every kind of pre-token boundary (`.\n`, `  `, `xa`, `\n\n`, ...): cutting a
/// pre-token in two, which the shipped vocabulary often cannot tell, changes its ids.
fn dense(pre_tokenizer: Value) -> Tokenizer {
    static TRAINED: OnceLock<Value> = OnceLock::new();
    let trained = TRAINED.get_or_init(|| {
        use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
        use tokenizers::pre_tokenizers::byte_level::ByteLevel;
        use tokenizers::{DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper, TokenizerImpl};
        let mut trainer = BpeTrainerBuilder::new()
            .vocab_size(4000)
            .min_frequency(2)
            .show_progress(false)
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .build();
        let mut tok: TokenizerImpl<BPE, NormalizerWrapper, PreTokenizerWrapper, PostProcessorWrapper, DecoderWrapper> =
            TokenizerImpl::new(BPE::default());
        tok.with_pre_tokenizer(Some(PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, false))));
        let mut z = 0xD5;
        let corpus: Vec<String> =
            (0..3000).map(|_| (0..40).map(|_| ATOMS[mix(&mut z) as usize % ATOMS.len()]).collect()).collect();
        tok.train(&mut trainer, corpus.into_iter()).expect("trains");
        serde_json::from_str(&tok.to_string(false).expect("serializes")).expect("parses")
    });
    let mut v = trained.clone();
    v["pre_tokenizer"] = pre_tokenizer;
    let mut tok = from_json(&v);
    let specials: Vec<AddedToken> = crate::train::SPECIAL_TOKENS.iter().map(|t| AddedToken::from(*t, true)).collect();
    tok.add_special_tokens(&specials);
    tok
}

/// The shipped tokenizer with a BOS/EOS template, as Llama-style tokenizers add them.
fn templated() -> Tokenizer {
    let mut v = shipped_json();
    v["post_processor"] = json!({"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
        {"type": "TemplateProcessing",
         "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                    {"SpecialToken": {"id": "<|im_end|>", "type_id": 0}}],
         "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
         "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0], "tokens": ["<|endoftext|>"]},
                            "<|im_end|>": {"id": "<|im_end|>", "ids": [2], "tokens": ["<|im_end|>"]}}},
    ]});
    from_json(&v)
}

/// Added tokens that straddle whitespace and punctuation cuts, overlap each other and the
/// special tokens, and match inside words (normalized, non-special ones).
const AWKWARD_TOKENS: [&str; 10] = ["hello world", "x.\n", "ing,", "m_st", "ab", "bc", "the", " .", "end|><|im", "x<"];

fn awkward(base: Tokenizer) -> Tokenizer {
    let mut tok = base;
    let plain: Vec<AddedToken> = AWKWARD_TOKENS.iter().map(|t| AddedToken::from(*t, false)).collect();
    tok.add_tokens(&plain);
    tok.add_special_tokens(&[
        AddedToken::from("<|a b|>", true),
        AddedToken::from("<|x\n|>", true),
        AddedToken::from("}<|", true),
    ]);
    tok
}

fn engine(tok: Tokenizer) -> EngineTokenizer {
    EngineTokenizer::new(tok, None, None, None).expect("builds")
}

/// An engine that cuts at every valid point, so every cut rule is exercised on every input.
fn cutting_everywhere(tok: Tokenizer) -> EngineTokenizer {
    let mut t = engine(tok);
    t.scheme = t.scheme.map(Scheme::cut_everywhere);
    t
}

/// Engines shared by the property tests (building one encodes the whole vocabulary).
macro_rules! shared {
    ($($name:ident = $make:expr;)*) => {$(
        fn $name() -> &'static EngineTokenizer {
            static T: OnceLock<EngineTokenizer> = OnceLock::new();
            T.get_or_init(|| $make)
        }
    )*};
}

shared! {
    shipped_everywhere = cutting_everywhere(shipped());
    dense_gpt2_everywhere = cutting_everywhere(dense(gpt2_pre_tokenizer()));
    dense_llama3_everywhere = cutting_everywhere(dense(llama3_pre_tokenizer()));
    awkward_gpt2_everywhere = cutting_everywhere(awkward(dense(gpt2_pre_tokenizer())));
    awkward_llama3_everywhere = cutting_everywhere(awkward(dense(llama3_pre_tokenizer())));
    awkward_shipped_everywhere = cutting_everywhere(awkward(shipped()));
    templated_everywhere = cutting_everywhere(templated());
    awkward_default = engine(awkward(shipped()));
    dense_default = engine(awkward(dense(gpt2_pre_tokenizer())));
}

fn reference(tok: &Tokenizer, text: &str, add_special_tokens: bool) -> Vec<u32> {
    tok.encode(text, add_special_tokens).expect("encodes").get_ids().to_vec()
}

fn chunked(t: &EngineTokenizer, text: &str, add_special_tokens: bool) -> Vec<u32> {
    let scheme = t.scheme.as_ref().expect("a chunking scheme");
    t.encode_chunked(scheme, text, add_special_tokens).expect("encodes")
}

/// The chunked encode of `text` stopped once `want` ids are there: its ids and bytes covered.
fn leading(t: &EngineTokenizer, text: &str, want: usize) -> (Vec<u32>, usize) {
    let scheme = t.scheme.as_ref().expect("a chunking scheme");
    let mut more = |ids: &[u32]| ids.len() < want;
    t.encode_pieces(scheme, text, Some(&mut more)).expect("encodes").expect("chunked")
}

/// Leading ids are the full encode's first ids, cover what was asked for, and encode the
/// bytes they say they cover.
fn check_leading(t: &EngineTokenizer, text: &str, want: usize) -> Result<(), TestCaseError> {
    let full = reference(&t.tokenizer, text, false);
    let (ids, covered) = leading(t, text, want);
    prop_assert!(ids.len() >= want.min(full.len()), "{} ids for {want} wanted", ids.len());
    prop_assert_eq!(&ids[..], &full[..ids.len()]);
    prop_assert_eq!(reference(&t.tokenizer, &text[..covered], false), ids);
    Ok(())
}

const ATOMS: &[&str] = &[
    // words and contractions
    "the",
    "hello",
    "world",
    "The",
    "cache",
    "tokens",
    "it's",
    "we're",
    "I'M",
    "they'LL",
    "ab",
    "bc",
    "abc",
    "there",
    "ing",
    "x",
    "end",
    "m_st",
    "Hello",
    "prompt",
    "worker",
    "s",
    "re",
    // whitespace
    " ",
    " ",
    " ",
    "  ",
    "   ",
    "\t",
    "\n",
    "\n",
    "\n\n",
    " \n",
    "\r\n",
    "\r",
    "\u{a0}",
    "\u{3000}",
    "\u{2003}",
    "\u{85}",
    "\u{1c}",
    "\u{b}",
    "\u{c}",
    "\u{200b}",
    "\u{feff}",
    "\u{180e}",
    // digits
    "0",
    "42",
    "2024",
    "1234567",
    "٣",
    "½",
    // punctuation
    ".",
    ",",
    "!",
    "?",
    ";",
    ":",
    "'",
    "\"",
    "(",
    ")",
    "{",
    "}",
    "-",
    "...",
    "'s",
    "'re",
    "'S",
    "<",
    ">",
    "|",
    "_",
    "#",
    // other scripts
    "é",
    "e\u{301}",
    "\u{301}",
    "東京",
    "中文",
    "。",
    "，",
    "、",
    "！",
    "？",
    "：",
    "；",
    "か",
    "カ",
    "ー",
    "한국어",
    "😀",
    "ß",
    "İ",
    "ſ",
    "\u{212a}",
    "Ω",
    "ñ",
    // special and added tokens, and fragments of them
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<|im_",
    "|>",
    "<|",
    "<|im_start|",
    "<|a b|>",
    "<|x\n|>",
    "hello world",
    "x.\n",
    "ing,",
    " .",
    "end|><|im",
];

fn atom() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => proptest::sample::select(ATOMS).prop_map(str::to_owned),
        1 => any::<char>().prop_map(String::from),
        1 => "\\PC{1,6}",
    ]
}

fn text(max_atoms: usize) -> impl Strategy<Value = String> {
    proptest::collection::vec(atom(), 0..max_atoms).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn cutting_everywhere_is_exact_gpt2(s in text(300)) {
        for t in [shipped_everywhere(), dense_gpt2_everywhere()] {
            prop_assert_eq!(chunked(t, &s, false), reference(&t.tokenizer, &s, false));
        }
    }

    #[test]
    fn cutting_everywhere_is_exact_llama3(s in text(300)) {
        let t = dense_llama3_everywhere();
        prop_assert_eq!(chunked(t, &s, false), reference(&t.tokenizer, &s, false));
    }

    #[test]
    fn cutting_everywhere_is_exact_with_awkward_added_tokens(s in text(300)) {
        for t in [awkward_gpt2_everywhere(), awkward_llama3_everywhere(), awkward_shipped_everywhere()] {
            prop_assert_eq!(chunked(t, &s, false), reference(&t.tokenizer, &s, false));
        }
    }

    #[test]
    fn cutting_everywhere_is_exact_with_a_template(s in text(200)) {
        let t = templated_everywhere();
        prop_assert_eq!(chunked(t, &s, true), reference(&t.tokenizer, &s, true));
        prop_assert_eq!(chunked(t, &s, false), reference(&t.tokenizer, &s, false));
    }

    /// Stopping anywhere leaves exactly the full encode's first ids, at every cut rule.
    #[test]
    fn leading_ids_are_exact_wherever_the_encode_stops(s in text(300), want in 0usize..400) {
        for t in [shipped_everywhere(), dense_llama3_everywhere(), awkward_gpt2_everywhere(), awkward_llama3_everywhere()] {
            check_leading(t, &s, want)?;
        }
    }

    /// Default chunk sizes, through the cache, stopping at any point of a shared prefix's tail.
    #[test]
    fn leading_ids_through_the_cache_are_exact(prefix in text(1200), a in text(200), want in 0usize..1500) {
        for t in [awkward_default(), dense_default()] {
            check_leading(t, &format!("{prefix}{a}"), usize::MAX)?;
            check_leading(t, &format!("{a}{prefix}"), want)?;
            check_leading(t, &format!("{prefix}{a}"), want)?;
        }
    }

    /// Default chunk sizes, through the cache: a shared prefix, then different tails.
    #[test]
    fn cached_prefixes_are_exact(prefix in text(1200), a in text(200), b in text(200)) {
        for t in [awkward_default(), dense_default()] {
            for s in [format!("{prefix}{a}"), format!("{prefix}{b}"), format!("{prefix}{a}"), format!("{a}{prefix}")] {
                prop_assert_eq!(chunked(t, &s, false), reference(&t.tokenizer, &s, false));
                prop_assert_eq!(t.encode_prompt(&s, true).expect("encodes"), reference(&t.tokenizer, &s, true));
            }
        }
    }
}

/// Cut positions that break each rule's conditions do change the ids (so the property tests
/// can see a wrong rule), and the scheme never cuts there.
#[test]
fn cuts_the_rules_forbid_would_change_the_ids() {
    let gpt2 = awkward_gpt2_everywhere();
    let llama3 = awkward_llama3_everywhere();
    let cases: &[(&EngineTokenizer, &str, &str)] = &[
        // whitespace after whitespace, and a letter after whitespace
        (gpt2, "hello ", " \nworld"),
        (gpt2, "the\n", "\n"),
        (gpt2, "hello  \n", "world"),
        // a newline after punctuation is part of the punctuation's pre-token in Llama-3
        (llama3, "the.", "\nthe"),
        // a pass-2 added token starting at the cut, cut short by a pass-1 match ("x<" vs "<|im_start|>")
        (gpt2, "cache", "x<|im_start|>"),
        // a pass-1 added token starting at the cut, overlapped by another ("}<|" vs "<|im_start|>")
        (gpt2, "the}", "<|im_start|>"),
        // inside an added token that holds a space
        (gpt2, "the hello", " world"),
        (gpt2, "<|a", " b|>"),
    ];
    for &(t, a, b) in cases {
        let whole = format!("{a}{b}");
        let mut pieces = reference(&t.tokenizer, a, false);
        pieces.extend(reference(&t.tokenizer, b, false));
        assert_ne!(pieces, reference(&t.tokenizer, &whole, false), "{whole:?}: this cut would be visible");
        let scheme = t.scheme.as_ref().expect("scheme");
        assert!(!scheme.cuts(&whole, &mut 0).contains(&a.len()), "{whole:?} must not be cut after {a:?}");
    }
}

#[test]
fn schemes_are_detected_for_supported_configurations_only() {
    let name = |tok: Tokenizer| engine(tok).cache_stats().scheme;
    assert_eq!(name(shipped()), "byte-level BPE, GPT-2 regex");
    assert_eq!(name(llama3()), "byte-level BPE, Llama-3 regex");
    assert_eq!(name(templated()), "byte-level BPE, GPT-2 regex");
    assert_eq!(name(awkward(shipped())), "byte-level BPE, GPT-2 regex");

    let variant = |f: &dyn Fn(&mut Value)| {
        let mut v = shipped_json();
        f(&mut v);
        from_json(&v)
    };
    let nfc = variant(&|v| v["normalizer"] = json!({"type": "NFC"}));
    let prefix_space = variant(&|v| v["pre_tokenizer"]["add_prefix_space"] = json!(true));
    let no_regex = variant(&|v| v["pre_tokenizer"]["use_regex"] = json!(false));
    let other_regex = variant(&|v| {
        v["pre_tokenizer"] = json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "\\d+|\\D+"}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]})
    });
    let dropout = variant(&|v| v["model"]["dropout"] = json!(0.1));
    assert_eq!(name(dropout), "off: model is not BPE without dropout");
    let roberta = variant(&|v| {
        v["post_processor"] = json!({"type": "RobertaProcessing", "sep": ["<|im_end|>", 2], "cls": ["<|im_start|>", 1],
            "trim_offsets": true, "add_prefix_space": false})
    });
    let mut lstrip = shipped();
    lstrip.add_special_tokens(&[AddedToken::from("<mask>", true).lstrip(true)]);
    let mut truncating = shipped();
    truncating
        .with_truncation(Some(tokenizers::TruncationParams { max_length: 5, ..Default::default() }))
        .expect("sets truncation");
    for (tok, why) in [
        (nfc, "off: normalizer"),
        (prefix_space, "off: pre-tokenizer"),
        (no_regex, "off: pre-tokenizer"),
        (other_regex, "off: pre-tokenizer"),
        (roberta, "off: post-processor"),
        (lstrip, "off: added token with single_word, lstrip or rstrip"),
        (truncating, "off: truncation or padding"),
    ] {
        let reference_tok = tok.clone();
        let t = engine(tok);
        assert_eq!(t.cache_stats().scheme, why);
        // Those are encoded whole, and so still exactly.
        let s = "Hello <|im_start|> world's 42 東京。\n\n  x".repeat(100);
        assert_eq!(t.encode_prompt(&s, true).expect("encodes"), reference(&reference_tok, &s, true), "{why}");
        assert_eq!(t.cache_stats().requests, 0, "{why}");
    }
}

/// SplitMix64, for deterministic pseudo-random prompts.
fn mix(z: &mut u64) -> u64 {
    *z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut x = *z;
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// About `bytes` of text (words, numbers, punctuation, newlines, some JSON).
pub(crate) fn prose(seed: u64, bytes: usize) -> String {
    const WORDS: &[&str] = &[
        "the", "request", "token", "cache", "worker", "cluster", "policy", "route", "queue", "prompt", "latency",
        "region", "provider", "tenant", "batch", "stream", "event", "block", "prefix", "engine", "model", "data",
        "because",
    ];
    let mut z = seed;
    let mut s = String::with_capacity(bytes + 64);
    while s.len() < bytes {
        let r = mix(&mut z);
        match r % 23 {
            0 => s.push_str(".\n"),
            1 => s.push_str(", "),
            2 => s.push_str(&format!("{} ", r % 10_000)),
            3 => s.push_str(&format!("{{\"key_{}\": [{}, true]}} ", r % 97, r % 1000)),
            _ => {
                s.push_str(WORDS[(r >> 8) as usize % WORDS.len()]);
                s.push(' ');
            }
        }
    }
    s
}

#[test]
fn a_repeated_prefix_is_not_encoded_again() {
    let t = engine(shipped());
    let base = prose(7, 80_000);
    let ids = chunked(&t, &base, true);
    assert_eq!(ids, reference(&t.tokenizer, &base, true));
    assert!(ids.len() > 16_000, "{}", ids.len());
    // The text of the first 16,000 tokens, then something new.
    let offsets = t.tokenizer.encode(base.as_str(), false).expect("encodes").get_offsets()[16_000].0;
    let tail = prose(8, 2_000);
    let next = format!("{}{tail}", &base[..offsets]);
    let before = t.cache_stats();
    assert_eq!(chunked(&t, &next, true), reference(&t.tokenizer, &next, true));
    let after = t.cache_stats();
    let encoded = after.encoded_bytes - before.encoded_bytes;
    // Only the chunk holding the first new byte onwards is encoded again.
    assert!(encoded <= (tail.len() + 2 * MAX_CHUNK) as u64, "{encoded} bytes encoded again");
    assert!(after.hits - before.hits > 100, "{after:?}");
}

/// What a router looking a prompt up needs: the cached prefix costs a copy, and of the new
/// text only the pieces before the caller stops are encoded; a new prompt stops at once.
#[test]
fn leading_ids_encode_only_what_is_asked_for() {
    let t = engine(shipped());
    let base = prose(7, 80_000);
    chunked(&t, &base, false);
    let cut = t.tokenizer.encode(base.as_str(), false).expect("encodes").get_offsets()[16_000].0;
    let next = format!("{}{}", &base[..cut], prose(8, 4_000));
    let full = reference(&t.tokenizer, &next, false);
    let before = t.cache_stats();
    let (ids, covered) = leading(&t, &next, 16_064);
    let after = t.cache_stats();
    assert!(ids.len() >= 16_064 && covered < next.len(), "{} ids, {covered} of {} bytes", ids.len(), next.len());
    assert_eq!(ids[..], full[..ids.len()]);
    // The chunk holding the first new byte, up to about 64 tokens into the new text.
    let encoded = after.encoded_bytes - before.encoded_bytes;
    assert!(encoded <= (MAX_CHUNK + 512) as u64, "{encoded} bytes encoded");
    assert_eq!(after.stopped_early - before.stopped_early, 1);

    // A prompt nothing is cached of: one piece, then the caller has what it needs.
    let cold = prose(99, 60_000);
    let before = t.cache_stats();
    let (ids, _) = leading(&t, &cold, 1);
    assert_eq!(ids[..], reference(&t.tokenizer, &cold, false)[..ids.len()]);
    let encoded = t.cache_stats().encoded_bytes - before.encoded_bytes;
    assert!(encoded <= 512, "{encoded} bytes encoded for one token");
}

/// The public entry encodes whole until the safety net has compared its first chunked
/// encodes, then stops where the caller does; a prompt encoded to its end is complete.
#[test]
fn encode_prompt_leading_is_whole_until_verified_then_lazy() {
    let t = engine(shipped());
    let mut want_100 = |ids: &[u32]| ids.len() < 100;
    let prompts: Vec<String> = (0..SEGMENT_VERIFY as u64 + 3).map(|i| prose(1_000 + i, 8_000)).collect();
    for (i, p) in prompts.iter().enumerate() {
        let got = t.encode_prompt_leading(p, false, &mut want_100).expect("encodes");
        let full = reference(&t.tokenizer, p, false);
        assert_eq!(got.ids[..], full[..got.ids.len()]);
        if i < SEGMENT_VERIFY {
            assert!(got.complete() && got.ids == full, "prompt {i} is encoded whole while verifying");
            assert_eq!(got.estimated_len(), full.len());
        } else {
            assert!(!got.complete() && got.ids.len() >= 100 && got.ids.len() < full.len() / 4, "prompt {i}");
            let estimate = got.estimated_len() as f64 / full.len() as f64;
            assert!((0.7..1.3).contains(&estimate), "estimated {} of {}", got.estimated_len(), full.len());
        }
    }
    let mut everything = |_: &[u32]| true;
    let got = t.encode_prompt_leading(&prompts[0], false, &mut everything).expect("encodes");
    assert!(got.complete());
    assert_eq!(got.ids, reference(&t.tokenizer, &prompts[0], false));
}

#[test]
fn chunking_resynchronises_after_an_edit_near_the_start() {
    let t = engine(shipped());
    let base = prose(11, 60_000);
    chunked(&t, &base, false);
    let edited = format!("A different first line, of another length.\n{}", &base[20..]);
    let before = t.cache_stats();
    assert_eq!(chunked(&t, &edited, false), reference(&t.tokenizer, &edited, false));
    let encoded = t.cache_stats().encoded_bytes - before.encoded_bytes;
    assert!(encoded <= 4 * MAX_CHUNK as u64, "{encoded} bytes encoded again");
}

/// Linear work on prompts made of special tokens: counted, not timed (the timing is in the
/// `tokenize` bench); the time bound is only a generous safety net.
#[test]
fn prompts_of_repeated_special_tokens_cost_linear_work() {
    let t = engine(shipped());
    let start = t.tokenizer.token_to_id("<|im_start|>").expect("special token");
    for unit in ["<|im_start|>", "<|im_start|>user\nhi<|im_end|>\n"] {
        let unit_ids = reference(&t.tokenizer, unit, false);
        let mut work = Vec::new();
        for n in [500_000, 1_000_000] {
            let text = unit.repeat(n);
            let before = t.cache_stats();
            let began = Instant::now();
            let ids = chunked(&t, &text, false);
            assert!(began.elapsed() < Duration::from_secs(20), "{:?}", began.elapsed());
            assert_eq!(ids.len(), n * unit_ids.len());
            assert!(ids.chunks(unit_ids.len()).all(|c| c == unit_ids.as_slice()));
            let after = t.cache_stats();
            let (chunks, steps) = (after.chunks - before.chunks, after.scan_steps - before.scan_steps);
            let encoded = after.encoded_bytes - before.encoded_bytes;
            assert!(steps <= text.len() as u64, "at most one look per byte");
            assert!(chunks <= (text.len() / MIN_CHUNK + 1) as u64);
            // The text repeats, so its chunks repeat: the encoder sees a few of them only.
            assert!(encoded <= 64 * MAX_CHUNK as u64, "{encoded}");
            work.push((chunks, steps));
        }
        let (small, large) = (work[0], work[1]);
        assert!(large.0 <= 2 * small.0 + 1 && large.0 + 1 >= 2 * small.0, "{work:?}");
        assert!(large.1 <= 2 * small.1 + MAX_CHUNK as u64 && large.1 + MAX_CHUNK as u64 >= 2 * small.1, "{work:?}");
    }
    // The public path (which also checks its first encodes against a full encode) agrees.
    let text = "<|im_start|>".repeat(500_000);
    let began = Instant::now();
    let ids = t.encode_prompt(&text, true).expect("encodes");
    assert!(began.elapsed() < Duration::from_secs(20), "{:?}", began.elapsed());
    assert!(ids.len() == 500_000 && ids.iter().all(|&i| i == start));
}

/// Llama-3-style tokenizers carry hundreds of added tokens sharing a long prefix: finding one
/// at a cut walks a trie, so near misses cost a few steps per byte, and cuts stay exact.
#[test]
fn many_added_tokens_with_a_shared_prefix_stay_cheap_and_exact() {
    let mut tok = shipped();
    let reserved: Vec<AddedToken> =
        (0..256).map(|i| AddedToken::from(format!("<|reserved_special_token_{i}|>"), true)).collect();
    tok.add_special_tokens(&reserved);
    let t = engine(tok);
    assert_eq!(t.cache_stats().scheme, "byte-level BPE, GPT-2 regex");
    let mut z = 3;
    let mixed: String = (0..20_000)
        .map(|_| match mix(&mut z) % 9 {
            0 => format!("<|reserved_special_token_{}|>", mix(&mut z) % 300),
            1 => "<|reserved_special_token_".to_owned(),
            2 => "<|im_start|>".to_owned(),
            _ => ATOMS[mix(&mut z) as usize % ATOMS.len()].to_owned(),
        })
        .collect();
    for text in [
        "<|reserved_special_token_7|>".repeat(200_000),
        format!("x {}", "<|reserved_special_token_".repeat(200_000)),
        mixed,
    ] {
        let before = t.cache_stats();
        let began = Instant::now();
        assert_eq!(chunked(&t, &text, false), reference(&t.tokenizer, &text, false));
        assert!(began.elapsed() < Duration::from_secs(20), "{:?}", began.elapsed());
        let after = t.cache_stats();
        assert!(after.scan_steps - before.scan_steps <= text.len() as u64);
    }
}

#[test]
fn the_cache_stays_within_its_byte_budget() {
    let t = engine(shipped()).with_cache_bytes(256 * 1024);
    for seed in 0..40 {
        let s = prose(seed, 20_000);
        assert_eq!(chunked(&t, &s, false), reference(&t.tokenizer, &s, false));
        let st = t.cache_stats();
        assert!(st.bytes <= st.budget, "{st:?}");
    }
    let st = t.cache_stats();
    assert!(st.evictions > 0 && st.entries > 0, "{st:?}");
    // No cache at all: still exact, nothing kept.
    let t = engine(shipped()).with_cache_bytes(0);
    let s = prose(1, 20_000);
    assert_eq!(chunked(&t, &s, false), reference(&t.tokenizer, &s, false));
    assert_eq!((t.cache_stats().entries, t.cache_stats().bytes), (0, 0));
}

/// A pre-token of about a million characters trips the regex engine's backtracking limit and
/// `tokenizers` then leaves the rest of the segment unsplit; such prompts are encoded whole.
#[test]
fn stretches_without_cuts_are_encoded_whole() {
    let t = dense_gpt2_everywhere();
    let after = " b c. d e";
    for run in ["a".repeat(1_200_000), " ".repeat(1_200_000), "\n".repeat(1_200_000), "中".repeat(400_000)] {
        let s = format!("x {run}{after}");
        let full = reference(&t.tokenizer, &s, false);
        if run.starts_with('a') {
            assert!(!full.ends_with(&reference(&t.tokenizer, after, false)), "the limit is hit: the rest is unsplit");
        }
        let before = t.cache_stats();
        assert_eq!(chunked(t, &s, false), full);
        assert_eq!(t.cache_stats().whole, before.whole + 1);
    }
    // Just under the bound, chunks are used (and the limit is far away).
    let s = format!("x {}{after}", "a".repeat(MAX_SAFE_CHUNK - 16));
    let before = t.cache_stats();
    assert_eq!(chunked(t, &s, false), reference(&t.tokenizer, &s, false));
    assert_eq!(t.cache_stats().whole, before.whole);
}

#[test]
fn cache_collisions_stay_exact() {
    let mut c = ChunkCache::new(1 << 20);
    c.insert(7, "one", Arc::from([1u32]));
    assert_eq!(c.get(7, "two"), None, "same hash, other text: a miss");
    c.insert(7, "two", Arc::from([2u32]));
    assert_eq!(c.get(7, "two").as_deref(), Some(&[2u32][..]));
    assert_eq!(c.get(7, "one"), None);
    assert_eq!(c.len(), 1);
}

#[test]
fn the_cache_evicts_least_recently_used_entries_first() {
    let cost = "aaaa".len() + 4 + ENTRY_OVERHEAD;
    let mut c = ChunkCache::new(3 * cost);
    for (k, t) in [(1, "aaaa"), (2, "bbbb"), (3, "cccc")] {
        c.insert(k, t, Arc::from([k as u32]));
    }
    assert!(c.get(1, "aaaa").is_some(), "1 is now the most recently used");
    c.insert(4, "dddd", Arc::from([4u32]));
    assert_eq!((c.len(), c.bytes, c.evictions), (3, 3 * cost, 1));
    assert!(c.get(2, "bbbb").is_none(), "2 was the least recently used");
    assert!(c.get(1, "aaaa").is_some() && c.get(3, "cccc").is_some() && c.get(4, "dddd").is_some());
    c.set_budget(cost);
    assert_eq!(c.len(), 1);
    assert!(c.get(4, "dddd").is_some(), "the most recently used stays");
}
