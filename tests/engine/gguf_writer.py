"""A tiny Llama written as an F32 GGUF file the way llama.cpp writes one (for loader tests)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers


def write_tiny_llama_gguf(hf_dir: Path, out_path: Path) -> Path:
    """Write the tiny Llama (weights and tokenizer) as a GGUF file the way llama.cpp does."""
    import gguf

    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    config = model.config
    by_id = {index: token for token, index in tokenizer.get_vocab().items()}
    tokens = [by_id[index] for index in range(len(by_id))]
    merges = json.loads((hf_dir / "tokenizer.json").read_text())["model"]["merges"]
    merges = [" ".join(pair) if isinstance(pair, list) else pair for pair in merges]
    special = set(tokenizer.all_special_ids)
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads

    def rope_permute(weight, n_head):
        # llama.cpp interleaves the rotary halves of q and k; transformers undoes it on load.
        return (
            weight.reshape(n_head, 2, weight.shape[0] // n_head // 2, *weight.shape[1:])
            .swapaxes(1, 2)
            .reshape(weight.shape)
        )

    writer = gguf.GGUFWriter(str(out_path), "llama")
    writer.add_name("tiny llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(config.hidden_size // heads)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if index in special else 1 for index in range(len(tokens))])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_unk_token_id(tokenizer.unk_token_id)
    writer.add_chat_template(tokenizer.chat_template)
    state = {name: tensor.numpy() for name, tensor in model.state_dict().items()}
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    for layer in range(config.num_hidden_layers):
        prefix = f"model.layers.{layer}."
        names = {
            "attn_norm": "input_layernorm",
            "attn_v": "self_attn.v_proj",
            "attn_output": "self_attn.o_proj",
            "ffn_norm": "post_attention_layernorm",
            "ffn_gate": "mlp.gate_proj",
            "ffn_up": "mlp.up_proj",
            "ffn_down": "mlp.down_proj",
        }
        for gguf_name, hf_name in names.items():
            writer.add_tensor(f"blk.{layer}.{gguf_name}.weight", state[f"{prefix}{hf_name}.weight"])
        q = rope_permute(state[f"{prefix}self_attn.q_proj.weight"], heads)
        k = rope_permute(state[f"{prefix}self_attn.k_proj.weight"], kv_heads)
        writer.add_tensor(f"blk.{layer}.attn_q.weight", q)
        writer.add_tensor(f"blk.{layer}.attn_k.weight", k)
    writer.add_tensor("output_norm.weight", state["model.norm.weight"])
    writer.add_tensor("output.weight", state["lm_head.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path
