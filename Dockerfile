FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY core ./core
COPY config ./config
COPY console ./console
COPY incidents ./incidents
COPY breakers ./breakers
COPY sdk ./sdk
COPY templates ./templates
COPY manage.py ./
# Both distributions: the SDK (sdk/, `brakeline`: the demo's training job uses it) and the console.
RUN pip install --no-cache-dir ./sdk . && BRAKELINE_DATA_DIR=/tmp/build python manage.py collectstatic --noinput
EXPOSE 8000
CMD ["python", "-m", "daphne", "-b", "0.0.0.0", "-p", "8000", "--verbosity", "0", "config.asgi:application"]
