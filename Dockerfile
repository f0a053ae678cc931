# One image for agents, orchestrators and the harness; the command picks the role:
#   docker run IMAGE serve agent agents.random_agent:RandomAgent --host 0.0.0.0 ...
# Layers go from the least to the most often changed, so a code edit rebuilds only the last.
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 OMP_NUM_THREADS=1
WORKDIR /app

# torch's CPU build first, alone: the default index alone would pull GBs of CUDA packages
# (2.13.0+cpu from the extra index sorts above 2.13.0; its own dependencies come from the
# default index)
RUN pip install torch==2.13.0 --extra-index-url https://download.pytorch.org/whl/cpu

# The other dependencies, read from setup.cfg alone: code edits don't reinstall them
COPY setup.cfg /src/
RUN python -c "import configparser; c = configparser.ConfigParser(); c.read('/src/setup.cfg'); \
print(c['options']['install_requires'])" > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt && rm /tmp/requirements.txt

# The user the services run as, and the entrypoint that drops to it (see the script)
RUN useradd --create-home --uid 1000 --user-group mistk \
 && mkdir -p /data /runs && chown mistk:mistk /data /runs
COPY docker/entrypoint.sh /usr/local/bin/mistk-rl-entrypoint

# The project itself, installed from /src and not left in /app, the working directory: the
# harness puts its working directory on the services' PYTHONPATH, where a source tree would
# shadow the installed package. .dockerignore keeps
# everything else out of the build context.
COPY pyproject.toml README.md /src/
COPY mistk_rl /src/mistk_rl
COPY agents /src/agents
COPY orchestrators /src/orchestrators
COPY harness /src/harness
RUN pip install --no-deps /src && rm -rf /src
COPY configs ./configs

ENTRYPOINT ["/usr/local/bin/mistk-rl-entrypoint"]
CMD ["--help"]
