"""Prompt templates and domain topic tables as data files, plus their loader.

Prompts live in YAML next to this file (`<name>.yaml`, domains in `domains/`), so they
can be read, diffed and versioned apart from code; see `loader` for the lookup order.
"""
from rexeval.prompts.errors import PromptError
from rexeval.prompts.loader import (Domain, Topic, inline_prompt, list_domains, list_prompts, load_domain,
                            load_prompt)
from rexeval.prompts.template import PromptTemplate
from rexeval.prompts.untrusted import delimit_untrusted

__all__ = ["load_prompt", "inline_prompt", "load_domain", "list_domains", "list_prompts", "PromptTemplate",
           "Domain", "Topic", "delimit_untrusted", "PromptError"]
