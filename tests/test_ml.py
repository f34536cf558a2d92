"""The Spark ML stages (spark_imagenet.ml): ImageClassifier's Params, their mapping onto TrainConfig and the
functions' keywords, errors naming the Param, save and load alone and in a Pipeline, the Spark Connect refusal,
and one Pipeline fit -> transform -> save -> load -> transform end to end on the tests' local[2] session."""

from __future__ import annotations

import re

import numpy as np
import pytest

from own_images import image_bytes
from spark_imagenet.errors import ConfigError
from spark_imagenet.ml import ImageClassifier, ImageClassifierModel
from spark_imagenet.ml.classifier import ESTIMATOR_PARAMS
from spark_imagenet.training.job.config import TrainConfig

#: The smallest training settings of the end-to-end tests (tests/test_train_e2e.py), as Params.
SMALL = dict(workers=2, epochs=1, batchSize=4, imageSize=72, width=0.25)


def values(stage) -> dict:
    """A stage's Param values (set or default) by Param name."""
    return {param.name: value for param, value in stage.extractParamMap().items()}


# ------------------------------------------------------------------ Params
def test_params_are_camel_case_with_the_defaults_of_the_config_and_the_functions():
    classifier = ImageClassifier()
    names = {p.name for p in classifier.params}
    assert {"imageCol", "labelCol", "datasetPath", "outputPath", "workers", "epochs", "batchSize", "imageSize",
            "width", "learningRate", "checkpointDir", "cropArea", "predictionCol", "topK"} <= names
    assert all(re.fullmatch(r"[a-z][a-zA-Z0-9]*", n) for n in names), names
    assert not {"master", "conf", "output"} & names  # the session is the DataFrame's
    assert (classifier.getImageCol(), classifier.getLabelCol(), classifier.getPredictionCol()) == \
           ("content", "label", "prediction")
    assert (classifier.getTopK(), classifier.getValFraction(), classifier.getBatchSize()) == (5, 0.1, 32)
    assert not classifier.isDefined(classifier.datasetPath) and classifier.getWorkers() is None
    # every training setting but master and conf is a Param, and the defaults are the configuration's
    assert {spec.target for spec in ESTIMATOR_PARAMS.groups["train"]} == set(TrainConfig.keys()) - {"master", "conf"}
    assert ImageClassifier(workers=3).trainConfig() == TrainConfig(workers=3)
    model = ImageClassifierModel()
    assert {p.name for p in model.params} == {"imageCol", "outputPath", "predictionCol", "topK",
                                              "predictionBatchSize", "maxImagePixels"}


def test_the_params_map_onto_the_training_config():
    classifier = ImageClassifier(**SMALL, outputPath="/runs/a", cropArea=(0.5, 1.0), lrSchedule="step",
                                 lrBoundaries=[1, 2], flip=False, mlflowTags={"team": "vision"})
    classifier.setEpochs(3).setCheckpointDir("/runs/a-checkpoints")
    assert classifier.trainConfig() == TrainConfig(workers=2, epochs=3, batch_size=4, image_size=72, width=0.25,
                                                   output="/runs/a", crop_area=(0.5, 1.0), lr_schedule="step",
                                                   lr_boundaries=(1, 2), flip=False, mlflow_tags={"team": "vision"},
                                                   checkpoint_dir="/runs/a-checkpoints")
    assert classifier.getCropArea() == [0.5, 1.0]  # a Param holds lists, as its JSON does
    assert "cropArea: the random crop's area range" in classifier.explainParams()


def test_copy_gives_an_independent_stage_with_the_same_uid():
    classifier = ImageClassifier(**SMALL, datasetPath="/data/shards")
    copied = classifier.copy({classifier.epochs: 5})
    assert copied is not classifier and copied.uid == classifier.uid
    assert (copied.getEpochs(), classifier.getEpochs()) == (5, 1)
    assert copied.getDatasetPath() == "/data/shards" and copied.trainConfig().recipe.epochs == 5
    copied.setWorkers(4)
    assert classifier.getWorkers() == 2
    model = ImageClassifierModel(outputPath="/runs/a", topK=2)
    assert values(model.copy()) == values(model) and model.copy().getTopK() == 2


@pytest.mark.parametrize("params", [dict(batchSize=0), dict(workers=None), dict(width="wide"), dict(imageSize=32),
                                    dict(cropArea=[2, 1]), dict(strategy="mirrored")])
def test_a_bad_training_value_names_its_param(params):
    with pytest.raises(ConfigError) as e:
        ImageClassifier(**{**SMALL, **params}).trainConfig()
    [(param, value)] = params.items()
    assert type(e.value) is ConfigError and (e.value.key, e.value.value) == (param, value)
    assert "\n" not in str(e.value)


def test_a_bad_param_is_worded_with_the_param_and_the_setting():
    """Wording test (Params): the Param, then the setting's own message."""
    with pytest.raises(ConfigError) as e:
        ImageClassifier(**{**SMALL, "batchSize": 0}).trainConfig()
    assert str(e.value) == ("ImageClassifier param 'batchSize': batch_size (--batch-size) must be an integer >= 1, "
                            "got 0")


def test_an_unknown_param_is_named_with_the_closest_one():
    with pytest.raises(ConfigError, match=r"ImageClassifier params: unknown key\(s\) 'wrkers' \(did you mean "
                                          r"'workers'\?\)"):
        ImageClassifier(wrkers=2)
    with pytest.raises(ConfigError, match=r"unknown key\(s\) 'top_k' \(did you mean 'topK'\?\)"):
        ImageClassifierModel().setParams(top_k=2)


def test_fit_and_transform_refuse_bad_params_before_reading_the_dataframe(tmp_path):
    """The checks of the Params, the sharding and the prediction keywords come before any use of the DataFrame
    (none is given here)."""
    paths = dict(datasetPath=str(tmp_path / "shards"), outputPath=str(tmp_path / "run"))
    with pytest.raises(ConfigError, match=r"^ImageClassifier param 'datasetPath' is required \(folder or bucket"):
        ImageClassifier(**SMALL, outputPath=paths["outputPath"]).fit(None)  # wording test (a required Param)
    for params, key, value in ((dict(datasetPath=paths["datasetPath"]), "outputPath", None),
                               (dict(**paths, jpegQuality=80), "jpegQuality", 80),
                               (dict(**paths, resize=256, maxSide=320), "resize", 256)):
        with pytest.raises(ConfigError) as e:
            ImageClassifier(**SMALL, **params).fit(None)
        assert type(e.value) is ConfigError and (e.value.key, e.value.value) == (key, value)
    for params, key in ((dict(valFraction=1.5), "valFraction"), (dict(onCorrupt="drop"), "onCorrupt")):
        with pytest.raises(ConfigError) as e:
            ImageClassifier(**SMALL, **paths, **params).fit(None)
        assert type(e.value) is ConfigError and e.value.key == key
    with pytest.raises(ConfigError) as e:
        ImageClassifierModel().transform(None)
    assert e.value.key == "outputPath"
    with pytest.raises(ConfigError) as e:
        ImageClassifierModel(outputPath=paths["outputPath"], topK=0).transform(None)
    assert (e.value.key, e.value.value) == ("topK", 0)
    assert not (tmp_path / "shards").exists() and not (tmp_path / "run").exists()


def test_a_plan_error_naming_options_says_which_params_they_are():
    error = ConfigError("--output /runs/a holds the outputs of an earlier run: give --overwrite, or another --output")
    named = ESTIMATOR_PARAMS.named(error, "train")
    assert str(named) == (f"{error} (as ImageClassifier params: --output is 'outputPath', --overwrite is "
                          "'overwrite')")
    assert ESTIMATOR_PARAMS.named(ConfigError("no option here"), "train").args == ("no option here",)


def test_a_spark_connect_dataframe_is_refused_in_one_line():
    """Without a server: a Connect DataFrame object (never used: the refusal comes first), alone and in a
    Pipeline."""
    pytest.importorskip("pyarrow", reason="the Spark Connect client (the connect extra) is not installed")
    pytest.importorskip("grpc_status", reason="the Spark Connect client (the connect extra) is not installed")
    from pyspark.ml import Pipeline
    from pyspark.sql.connect.dataframe import DataFrame

    df = object.__new__(DataFrame)  # DataFrame.__new__ takes a plan and a session in pyspark 4.1
    expected = (r"^{}: this DataFrame belongs to a Spark Connect session, and the spark_imagenet.ml stages run on "
                r"a classic SparkSession only; under Spark Connect call spark_imagenet.shard_dataframe, train and "
                r"predict_dataframe, which work there$")
    classifier = ImageClassifier(**SMALL, datasetPath="/data/shards", outputPath="/runs/a")
    for stage in (classifier, Pipeline(stages=[classifier])):
        with pytest.raises(ConfigError, match=expected.format("ImageClassifier.fit")):
            stage.fit(df)
    with pytest.raises(ConfigError, match=expected.format("ImageClassifierModel.transform")):
        ImageClassifierModel(outputPath="/runs/a").transform(df)


# ------------------------------------------------------- save and load (Spark writes the metadata)
def test_an_unfitted_classifier_saves_and_loads_alone_and_in_a_pipeline(spark, tmp_path):
    from pyspark.ml import Pipeline

    classifier = ImageClassifier(**SMALL, datasetPath="/data/shards", outputPath="/runs/a", cropArea=(0.5, 1.0),
                                 mlflowTags={"team": "vision"}, topK=3)
    classifier.write().save(str(tmp_path / "classifier"))
    loaded = ImageClassifier.load(str(tmp_path / "classifier"))
    assert type(loaded) is ImageClassifier and loaded.uid == classifier.uid
    assert values(loaded) == values(classifier) and loaded.trainConfig() == classifier.trainConfig()
    Pipeline(stages=[classifier]).write().overwrite().save(str(tmp_path / "pipeline"))
    stage, = Pipeline.load(str(tmp_path / "pipeline")).getStages()
    assert type(stage) is ImageClassifier and values(stage) == values(classifier)


def test_a_model_saves_its_folder_by_reference_and_loads(spark, tmp_path):
    import json

    model = ImageClassifierModel(outputPath="gs://bucket/runs/a", topK=2, predictionCol="scores")
    model.write().save(str(tmp_path / "model"))
    metadata = json.loads(next((tmp_path / "model" / "metadata").glob("part-*")).read_text())
    assert metadata["class"] == "spark_imagenet.ml.classifier.ImageClassifierModel"
    assert metadata["paramMap"] == {"outputPath": "gs://bucket/runs/a", "topK": 2, "predictionCol": "scores"}
    loaded = ImageClassifierModel.load(str(tmp_path / "model"))
    assert values(loaded) == values(model) and loaded.uid == model.uid
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == ["metadata"]  # no weights: a reference


# ---------------------------------------------------------------------------------- end to end
@pytest.mark.slow
@pytest.mark.lanes  # the Spark 4.1 and 4.2 lanes' shard_dataframe, barrier training and predict_dataframe
def test_a_pipeline_fits_transforms_like_predict_dataframe_and_saves_and_loads(spark, tmp_path):
    """Pipeline([ImageClassifier]).fit(df) on local[2] (shard_dataframe, then two barrier workers for one epoch),
    its transform against predict_dataframe on the same --output, and the fitted pipeline saved and loaded."""
    from pyspark.ml import Pipeline, PipelineModel

    from spark_imagenet import predict_dataframe

    classes = ("daisy", "rose", "tulip")
    rows = [(image_bytes(10 * k + i), name, f"{name}_{i}.jpg", "val" if i % 4 == 3 else "train")
            for k, name in enumerate(classes) for i in range(8)]  # 18 train, 6 val
    df = spark.createDataFrame(rows, "content binary, label string, name string, split string")
    run = tmp_path / "run"
    classifier = ImageClassifier(**SMALL, datasetPath=str(tmp_path / "shards"), outputPath=str(run),
                                 splitCol="split", nameCol="name", trainShards=2, valShards=1,
                                 cache=str(tmp_path / "cache"), topK=2)
    fitted = Pipeline(stages=[classifier]).fit(df)
    model, = fitted.stages
    assert type(model) is ImageClassifierModel and model.getOutputPath() == str(run) and model.getTopK() == 2
    assert model.summary.workers == 2 and model.summary.val.images == 6

    def classes_of(frame) -> dict[str, tuple[list[int], list[float]]]:
        return {r["name"]: (list(r["prediction"]["class_ids"]), list(r["prediction"]["probabilities"]))
                for r in frame.select("name", "prediction").collect()}

    expected = classes_of(predict_dataframe(df, str(run), top_k=2))
    assert len(expected) == 24 and all(len(ids) == 2 for ids, _ in expected.values())
    fitted.write().save(str(tmp_path / "pipeline"))
    loaded = PipelineModel.load(str(tmp_path / "pipeline"))
    assert values(loaded.stages[0]) == values(model)
    for got in (classes_of(fitted.transform(df)), classes_of(loaded.transform(df))):
        assert {n: ids for n, (ids, _) in got.items()} == {n: ids for n, (ids, _) in expected.items()}
        for name, (_, probabilities) in got.items():
            np.testing.assert_allclose(probabilities, expected[name][1], atol=1e-6)
