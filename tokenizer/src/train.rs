//! Trains the project's own byte-level BPE tokenizer from text the project generates.
//!
//! `switchyard sim train-tokenizer --out DIR` writes a Hugging Face tokenizer directory:
//! `tokenizer.json` (byte-level BPE, ChatML special tokens) and `tokenizer_config.json` (chat
//! template, special tokens). The corpus is generated deterministically from a word list, so
//! nothing is downloaded. Byte-level BPE round-trips any text, which load generators need
//! (they encode text, truncate to N tokens and decode).

use std::fs;
use std::path::Path;

use serde_json::json;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper, TokenizerImpl,
};

use super::TokenizerError;

/// SplitMix64 step: a tiny deterministic generator for the corpus.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// ChatML template: every turn is `<|im_start|>role\ncontent<|im_end|>\n`.
pub const CHAT_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Special tokens, in id order.
pub const SPECIAL_TOKENS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// Vocabulary size of the shipped tokenizer.
pub const VOCAB_SIZE: usize = 8192;

const WORDS: &str = "the of and to in is that for it as was with be by on not he this are or his from at which but have an they you were one all we can her has there been if more when will would who so no she other its may these about than into them could time only new some two first then do any like my now over such our man me even most made after also did many before must through back years where much your way well down should because each just those people how too little state good very make world still own see men work long get here between both life being under never day same another know while last might us great old year off come since against go came right used take three states himself few house use during without again place around however home small found thought went say part once general high upon school every does got united left number course war until always away something fact though water less public put think almost hand enough far took head yet government system better set told nothing night end why called didn find look going asked later point knew city next program business give group toward young days let room president side social given present several order national possible rather second face per among form important often things looked early white case john become large big need four within felt along children saw best church ever least power development light thing seemed family interest want members mind country area others done turned although open god service problem certain kind different thus began door help sense means whole matter perhaps itself york times law human line above name example action company hands local show whether five history gave today either act feet across taken past quite anything seen having death week experience really data model request token cache worker cluster policy route queue prompt latency region provider tenant batch stream event block prefix engine";

fn corpus(seed: u64, lines: usize) -> Vec<String> {
    let words: Vec<&str> = WORDS.split_whitespace().collect();
    let punct = [".", ",", ";", ":", "?", "!"];
    let mut state = seed;
    let mut next = move || {
        state = mix(state);
        state
    };
    (0..lines)
        .map(|i| {
            let n = 6 + (next() % 30) as usize;
            let mut line = String::new();
            for j in 0..n {
                let w = words[(next() % words.len() as u64) as usize];
                if j == 0 || next() % 9 == 0 {
                    let mut c = w.chars();
                    if let Some(f) = c.next() {
                        line.extend(f.to_uppercase());
                        line.push_str(c.as_str());
                    }
                } else {
                    line.push_str(w);
                }
                match next() % 23 {
                    0 => line.push_str(punct[(next() % 6) as usize]),
                    1 => line.push_str(&format!(" {}", next() % 10_000)),
                    2 => line.push_str(&format!(" \"{w}\"")),
                    _ => {}
                }
                line.push(' ');
            }
            if i % 17 == 0 {
                line.push_str(&format!(
                    "{{\"key_{}\": [{}, {}], \"ok\": true}}",
                    next() % 100,
                    next() % 1000,
                    next() % 1000
                ));
            }
            line.trim_end().to_owned() + "\n"
        })
        .collect()
}

type Bpe = TokenizerImpl<BPE, NormalizerWrapper, PreTokenizerWrapper, PostProcessorWrapper, DecoderWrapper>;

/// Trains the tokenizer and writes the Hugging Face directory `out`.
pub fn train(out: &Path) -> Result<(), TokenizerError> {
    let err = |e: Box<dyn std::error::Error + Send + Sync>| TokenizerError::Encode(e.to_string());
    let specials: Vec<AddedToken> = SPECIAL_TOKENS.iter().map(|t| AddedToken::from(*t, true)).collect();
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(VOCAB_SIZE)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(specials.clone())
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let mut tokenizer: Bpe = TokenizerImpl::new(BPE::default());
    tokenizer.with_pre_tokenizer(Some(PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true))));
    tokenizer.with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevelDecoder::default())));
    tokenizer.train(&mut trainer, corpus(0x5eed, 40_000).into_iter()).map_err(err)?;
    tokenizer.add_special_tokens(&specials);
    fs::create_dir_all(out).map_err(|e| TokenizerError::File { path: out.to_owned(), message: e.to_string() })?;
    tokenizer.save(out.join("tokenizer.json"), false).map_err(err)?;

    let added: serde_json::Map<String, serde_json::Value> = SPECIAL_TOKENS
        .iter()
        .filter_map(|t| {
            let id = tokenizer.token_to_id(t)?;
            Some((
                id.to_string(),
                json!({"content": t, "lstrip": false, "normalized": false, "rstrip": false, "single_word": false, "special": true}),
            ))
        })
        .collect();
    let config = json!({
        "added_tokens_decoder": added,
        "bos_token": null,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": null,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": false,
        "model_max_length": 1_000_000,
        "tokenizer_class": "PreTrainedTokenizerFast",
    });
    let text = serde_json::to_string_pretty(&config).map_err(|e| TokenizerError::Encode(e.to_string()))?;
    let path = out.join("tokenizer_config.json");
    fs::write(&path, text + "\n").map_err(|e| TokenizerError::File { path, message: e.to_string() })?;
    Ok(())
}
