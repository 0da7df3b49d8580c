"""Weight mapping to and from HF transformers' layouts, one module per model family.

Every conversion works on plain state dicts and config objects (or dicts), so attnkit never imports
transformers; only the parity tests do, as the independent reference.
"""

from attnkit.convert.bert import from_hf_bert, hf_bert_config_kwargs, to_hf_bert
from attnkit.convert.gpt2 import from_hf_gpt2, hf_gpt2_config_kwargs, to_hf_gpt2
from attnkit.convert.hf_folder import from_hf
from attnkit.convert.marian import from_hf_marian, hf_marian_config_kwargs, to_hf_marian

__all__ = [
    "from_hf",
    "from_hf_bert",
    "from_hf_gpt2",
    "from_hf_marian",
    "hf_bert_config_kwargs",
    "hf_gpt2_config_kwargs",
    "hf_marian_config_kwargs",
    "to_hf_bert",
    "to_hf_gpt2",
    "to_hf_marian",
]
