FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY console ./console
COPY incidents ./incidents
COPY breakers ./breakers
COPY brakeline ./brakeline
COPY templates ./templates
COPY manage.py ./
RUN pip install --no-cache-dir . && BRAKELINE_DATA_DIR=/tmp/build python manage.py collectstatic --noinput
EXPOSE 8000
CMD ["python", "-m", "daphne", "-b", "0.0.0.0", "-p", "8000", "--verbosity", "0", "config.asgi:application"]
