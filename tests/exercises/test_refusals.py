"""Exercises that ask for what a kvlib function computes refuse that function, however it is called,
and still accept a learner's own helper that happens to share its name."""
from __future__ import annotations

import functools

import pytest

import kvlib.cache
import kvlib.measure.flops
import kvlib.quant.formats
from kvlib.cache import kv_bytes_per_token as library_kv_bytes_per_token, quantize_int8 as library_quantize_int8
from kvlib.exercises import (CheckFailed, check_max_context, check_predict_step_flops, check_quantize_int4,
                             check_quantize_int8)
from kvlib.measure.flops import step_flops
from kvlib.quant import quantize_int4_groups

from . import test_memory
from .test_cost import predict_step_flops


def _by_attribute_flops(config, n, use_cache):
    return kvlib.measure.flops.step_flops(config, n, 1 if use_cache else n).total


def _by_name_flops(config, n, use_cache):
    return step_flops(config, n, 1 if use_cache else n).total


alias = library_kv_bytes_per_token


def _through_an_alias(config, n_params, memory_bytes, batch):
    return max(0, (memory_bytes - 2 * n_params) // (alias(config, 2) * batch))


@pytest.mark.parametrize("check, fn, name", [
    (check_predict_step_flops, _by_attribute_flops, "step_flops"),
    (check_predict_step_flops, _by_name_flops, "step_flops"),
    (check_predict_step_flops, lambda c, n, u: step_flops(c, n, 1 if u else n).total, "step_flops"),
    (check_max_context, _through_an_alias, "kv_bytes_per_token"),
    (check_max_context, lambda c, p, m, b: max(0, (m - 2 * p) // kvlib.cache.kv_cache_bytes(c, 1, b, 2)),
     "kv_cache_bytes"),
    (check_quantize_int8, library_quantize_int8, "quantize_int8"),
    (check_quantize_int8, functools.partial(library_quantize_int8), "quantize_int8"),
    (check_quantize_int8, lambda x: kvlib.cache.quantize_int8(x), "quantize_int8"),
    (check_quantize_int4, quantize_int4_groups, "quantize_int4_groups"),
    (check_quantize_int4, lambda w, g: kvlib.quant.formats.quantize_int4_groups(w, g), "quantize_int4_groups"),
])
def test_calling_the_library_answer_is_refused(check, fn, name):
    with pytest.raises(CheckFailed, match=f"kvlib's `{name}`, which computes the answer"):
        check(fn)


def test_a_learner_function_calling_the_library_under_its_own_name_is_refused():
    namespace = {"kvlib": kvlib}                      # as in the notebook: their def rebinds the name
    exec("from kvlib.cache import quantize_int8\n"
         "def quantize_int8(x):\n"
         "    return kvlib.cache.quantize_int8(x)\n", namespace)
    with pytest.raises(CheckFailed, match="calls kvlib's `quantize_int8`"):
        check_quantize_int8(namespace["quantize_int8"])


def test_the_reference_solutions_are_not_refused(capsys):
    check_predict_step_flops(predict_step_flops)
    check_max_context(test_memory.max_context)
    check_quantize_int8(test_memory.quantize_int8)
    assert capsys.readouterr().out.count("✓") == 3


def test_a_helper_of_the_same_name_written_by_the_learner_is_allowed(capsys):
    namespace = {}
    exec("def kv_bytes_per_token(config):\n"
         "    return 2 * config.n_layers * config.n_kv_heads * config.head_dim * 2\n"
         "def max_context(config, n_params, memory_bytes, batch):\n"
         "    return max(0, (memory_bytes - 2 * n_params) // (kv_bytes_per_token(config) * batch))\n", namespace)
    check_max_context(namespace["max_context"])
    assert "✓ Exercise 6.1" in capsys.readouterr().out
