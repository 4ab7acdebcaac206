"""A character-level Hugging Face tokenizer, built with `tokenizers`, for the tiny demo models.

    tok = build_char_tokenizer("0123456789+-*= ")
    tok("47+38=")["input_ids"]   # [bos, '4', '7', '+', '3', '8', '=']
    tok.save_pretrained(path)    # a standard tokenizer.json; AutoTokenizer loads it back
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]


def build_char_tokenizer(alphabet: str) -> PreTrainedTokenizerFast:
    chars = sorted(set(alphabet))
    vocab = {tok: i for i, tok in enumerate(SPECIALS + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()  # concatenate characters back without spaces
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="left",
    )
