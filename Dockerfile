# One image for agents, orchestrators and the harness; the command picks the role.
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 OMP_NUM_THREADS=1
WORKDIR /app
# torch's CPU wheel first (the default index would pull GBs of CUDA packages)
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY setup.cfg pyproject.toml README.md ./
COPY mistk_rl ./mistk_rl
COPY openapi ./openapi
COPY agents ./agents
COPY orchestrators ./orchestrators
COPY harness ./harness
COPY configs ./configs
RUN pip install .
RUN useradd --create-home mistk && mkdir -p /data /runs && chown mistk /data /runs
USER mistk
ENTRYPOINT ["mistk-rl"]
