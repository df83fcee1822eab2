"""Small Hugging Face models built from their configs (no weights) for ``mpsim import-torch`` tests.

Each factory builds the model class people train (``LlamaForCausalLM``, ``GPT2LMHeadModel``,
``BertModel``) at a few layers; ``mpsim import-torch`` calls it on the meta device.
"""


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
                                        num_attention_heads=8, num_key_value_heads=4, vocab_size=32000,
                                        max_position_embeddings=256))


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(n_embd=256, n_layer=4, n_head=4, n_positions=256, vocab_size=5000,
                                      bos_token_id=0, eos_token_id=0))


def bert():
    from transformers import BertConfig, BertModel

    return BertModel(BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
                                vocab_size=5000))
