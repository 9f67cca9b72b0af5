"""models.gguf_read_once: inside it a GGUF file is parsed once and gguf's tensor-name table
built once per (architecture, layers); outside it the gguf package is as it was. (The
SmolLM2 conversion it speeds up, byte for byte the same files, is
tests/e2e/test_smollm2_conversion.py's.)"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from grpo_hpc.train.setup.models import gguf_read_once


def _tiny_gguf(path: Path) -> Path:
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_tensor("token_embd.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_gguf_is_read_once_inside_and_as_before_outside(tmp_path: Path) -> None:
    path = _tiny_gguf(tmp_path / "m.gguf")
    reader, names = gguf.GGUFReader, gguf.get_tensor_name_map
    with gguf_read_once():
        first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(str(path)) is first  # one parse per file
        assert [t.name for t in first.tensors] == ["token_embd.weight"]
        arch = gguf.MODEL_ARCH.LLAMA
        assert gguf.get_tensor_name_map(arch, 2) is gguf.get_tensor_name_map(arch, 2)
        assert gguf.get_tensor_name_map(arch, 2).get_name("model.embed_tokens") == "token_embd"
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (reader, names)
    assert gguf.GGUFReader(path) is not gguf.GGUFReader(path)  # ordinary again
