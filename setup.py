"""ce_retrieval: cross-example softmax and deep metric learning for two-tower image-text retrieval."""

from setuptools import find_packages, setup

setup(
    name="ce_retrieval",
    version="0.1.0",
    description=__doc__,
    long_description=open("README.md", encoding="utf-8").read()
    if __import__("os").path.exists("README.md")
    else __doc__,
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10,<3.13",
    packages=find_packages(include=["ce_retrieval", "ce_retrieval.*"]),
    package_data={"ce_retrieval.cli": ["demo_range.json"]},  # the demo's figures over seeds (demo_record.py)
    install_requires=[
        # Exact, verified pins live in requirements.txt; these are the direct dependencies.
        "tensorflow~=2.20.0",
        "tf-keras~=2.20.0",
        "tensorflow-text~=2.20.0",
        "tensorflow-hub>=0.16.1",
        "tf-models-official~=2.20.0",
        "keras-cv==0.9.0",
        "tensorflow-similarity==0.17.1",
        "scann==1.4.2",
        "numpy>=2",
        "scikit-learn",
        "matplotlib",
        "pyyaml",
        "pillow",
    ],
    extras_require={
        "dev": ["pytest", "pytest-xdist", "pytest-timeout", "ruff"],
        "serve": ["fastapi", "uvicorn", "httpx"],
    },
    entry_points={"console_scripts": ["ce-retrieval=ce_retrieval.cli:main"]},
)
