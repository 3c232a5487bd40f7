"""The seed's data-preparation API: horizon_tc_ui.data.transformer / .dataloader on the one transforms module.

SEED_SNIPPET is ptq_guide_x5's calibration-data code ("Preparing Calibration
Data"), copied verbatim: pasted into a file with its imports, it writes the
calibration files makertbin reads, with the same bytes hb_eval_preprocess
writes for the same configuration and, for the preprocess_on pipeline, the
same samples preprocess_on computes from the image. Images are synthetic text
pages and real photos (the sample package's), as PNG and JPEG, at sizes where
the toolchain's truncating short-side resize differs from rounding.
"""
import os

import numpy as np
import pytest
import skimage.io  # noqa: F401 (the seed snippet's reader; a test dependency)
import yaml
from PIL import Image

from bpuemu.common.container import read_bin
from bpuemu.common.input_types import to_model_input
from bpuemu.host.convert.caldata import CalInput, read_sample
from bpuemu.host.samples import text_image, write_sample_project
from bpuemu.host.tools.eval_preprocess import load_table, preprocess


SEED_SNIPPET = """
# This example uses skimage; OpenCV usage may differ
# Note: The transformers below do not include mean subtraction or scaling
# Mean and scale operations are fused into the model; refer to norm_type/mean_value/scale_value configuration below
def data_transformer():
    transformers = [
    # Scale proportionally, short side to 256
    ShortSideResizeTransformer(short_size=256),
    # CenterCrop to get 224x224 image
    CenterCropTransformer(crop_size=224),
    # skimage reads as NHWC, convert to NCHW required by model
    HWC2CHWTransformer(),
    # skimage reads RGB, convert to BGR required by model
    RGB2BGRTransformer(),
    # skimage values in [0.0,1.0], adjust to model's required range
    ScaleTransformer(scale_value=255)
    ]

    return transformers

# src_image: original image from calibration set
# dst_file: filename for storing final calibration data
def convert_image(src_image, dst_file, transformers):
    image = skimage.img_as_float(skimage.io.imread(src_image))
    for trans in transformers:
        image = trans(image)
    # Model specifies input_type_train BGR as UINT8
    image = image.astype(np.uint8)
    # Save calibration sample as binary data file
    image.tofile(dst_file)

if __name__ == '__main__':
    # Pseudocode: collection of original calibration images
    src_images = ['ILSVRC2012_val_00000001.JPEG', ...]
    # Pseudocode: final calibration filenames (extension not restricted)
    # calibration_data_bgr_f32 is the cal_data_dir specified in your config file
    dst_files = ['./calibration_data_bgr_f32/ILSVRC2012_val_00000001.bgr', ...]

    transformers = data_transformer()
    for src_image, dst_file in zip(src_images, dst_files):
        convert_image(src_image, dst_file, transformers)
"""

#: ptq_guide_x5's "default preprocessing" of preprocess_on (its indentation repaired, a return added).
PREPROCESS_ON_SNIPPET = """
def data_transformer(norm_type, input_dim, input_type_train):
    image_width = input_dim[2]
    image_height = input_dim[1]
    transformers = [
        ResizeTransformer((image_height, image_width)),
        HWC2CHWTransformer(), # to CXHXW
        RGB2BGRTransformer(),
    ]

    transformers.append(ScaleTransformer(255))
    return transformers
"""

#: The snippet's configuration as an hb_eval_preprocess entry: short side 256, centre 224, BGR planes.
EVAL_ENTRY = {"seed": {"size": "224x224", "resize": "short_side", "resize_to": 256, "crop": "center",
                       "input_type_rt": "bgr", "input_layout_rt": "NCHW"}}
#: (height, width): 427x640 gives 383.7 for the long side, truncated to 383 (rounding would say 384).
SIZES = [(427, 640), (500, 375), (301, 300), (256, 300)]


def _seed_namespace(*snippets):
    ns = {"__name__": "calibration_prep"}
    exec("import numpy as np\nimport skimage\nimport skimage.io\nfrom horizon_tc_ui.data.transformer import *", ns)
    for code in snippets:
        exec(code, ns)
    return ns


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    d = tmp_path_factory.mktemp("seedimages")
    rng = np.random.default_rng(5)
    names = []
    for i, (h, w) in enumerate(SIZES):
        page = text_image(h, w, rng).copy()
        page[: h // 3] = rng.integers(0, 256, (h // 3, w, 3), dtype=np.uint8)  # colour noise: channels differ
        name = f"img{i}.{'jpg' if i % 2 else 'png'}"
        Image.fromarray(page).save(d / name)
        names.append(name)
    return d, names


def test_seed_snippet_as_written_writes_hb_eval_preprocess_bytes(images, tmp_path):
    d, names = images
    ns = _seed_namespace(SEED_SNIPPET)
    table = load_table(str(_write(tmp_path / "table.yaml", EVAL_ENTRY)))
    for name in names:
        dst = tmp_path / (name + ".bgr")
        ns["convert_image"](str(d / name), str(dst), ns["data_transformer"]())
        assert dst.stat().st_size == 3 * 224 * 224
        assert dst.read_bytes() == preprocess(str(d / name), table["seed"]), name


def test_preprocess_on_pipeline_writes_what_calibration_reads_from_the_image(images, tmp_path):
    d, names = images
    ns = _seed_namespace(SEED_SNIPPET, PREPROCESS_ON_SNIPPET)
    for name in names:
        dst = tmp_path / (name + ".bgr")
        ns["convert_image"](str(d / name), str(dst), ns["data_transformer"](None, (3, 96, 128), "bgr"))
        from_file = read_sample(str(dst), CalInput("data", str(tmp_path), (1, 3, 96, 128), dtype="uint8",
                                                   input_type_train="bgr"))
        from_image = read_sample(str(d / name), CalInput("data", str(d), (1, 3, 96, 128), preprocess_on=True,
                                                         input_type_train="bgr"))
        assert np.array_equal(from_file, from_image), name


def test_makertbin_reads_the_seed_snippet_files_as_the_board_reads_hb_eval_preprocess(images, tmp_path):
    """makertbin calibrates on the snippet's files; its dumped calibration feeds are the board's model input
    for hb_eval_preprocess's bytes of the same images."""
    d, names = images
    config = write_sample_project(str(tmp_path), size=224, input_type_rt="bgr", samples=1)
    doc = yaml.safe_load(open(config))
    ns = _seed_namespace(SEED_SNIPPET)
    cal = tmp_path / "calibration_data_bgr"
    cal.mkdir()
    for i, name in enumerate(names):
        ns["convert_image"](str(d / name), str(cal / f"{i}.bgr"), ns["data_transformer"]())
    doc["input_parameters"].update(input_type_train="bgr", input_layout_train="NCHW", input_layout_rt="NCHW")
    doc["calibration_parameters"].update(cal_data_dir=str(cal), cal_data_type="uint8", calibration_type="max")
    doc["model_parameters"]["debug_mode"] = "dump_calibration_data"
    _write(config, doc)
    from bpuemu.host.mapper.makertbin import makertbin_from_config

    makertbin_from_config(config, "onnx")
    out = os.path.join(os.path.dirname(config), doc["model_parameters"]["working_dir"])
    spec = read_bin(os.path.join(out, doc["model_parameters"]["output_model_file_prefix"] + ".bin")).model().input_specs[0]
    table = load_table(str(_write(tmp_path / "table.yaml", EVAL_ENTRY)))
    for i, name in enumerate(names):
        rt = np.frombuffer(preprocess(str(d / name), table["seed"]), np.uint8)
        fed = np.load(os.path.join(out, "calibration_data", spec.name, f"{i}.npy"))
        assert np.array_equal(to_model_input(rt, spec).astype(np.float32), fed), name


def test_opencv_and_skimage_reads_give_the_same_bytes(images):
    """--read_mode opencv (BGR 0..255 uint8) and skimage (RGB 0..1 float) with their pipelines agree."""
    from horizon_tc_ui.data.dataloader import SingleImageDataLoader
    from horizon_tc_ui.data.transformer import (CenterCropTransformer, HWC2CHWTransformer, RGB2BGRTransformer,
                                                ScaleTransformer, ShortSideResizeTransformer)

    d, names = images
    for name in names:
        sk = SingleImageDataLoader([ShortSideResizeTransformer(short_size=64), CenterCropTransformer(crop_size=56),
                                    HWC2CHWTransformer(), RGB2BGRTransformer(), ScaleTransformer(scale_value=255)],
                                   str(d / name), imread_mode="skimage")
        cv = SingleImageDataLoader([ShortSideResizeTransformer(short_size=64), CenterCropTransformer(crop_size=56),
                                    HWC2CHWTransformer()], str(d / name), imread_mode="opencv")
        assert sk.shape == cv.shape == (1, 3, 56, 56)
        assert np.array_equal(sk.astype(np.uint8), cv.astype(np.uint8)), name


def test_a_list_of_images_in_gives_a_list_out_and_layouts_are_the_toolchains():
    from horizon_tc_ui.data.transformer import (BGR2NV12Transformer, BGR2RGBTransformer, CHW2HWCTransformer,
                                                HWC2CHWTransformer, MeanTransformer, NV12ToYUV444Transformer,
                                                PadResizeTransformer, ResizeTransformer, RGB2YUV444Transformer)

    img = np.zeros((20, 40, 3), np.uint8)
    img[..., 2] = 200  # red in BGR
    out = ResizeTransformer((10, 20))([img, img[:, :20]])
    assert isinstance(out, list) and [o.shape for o in out] == [(10, 20, 3), (10, 20, 3)]
    assert out[0].dtype == np.float32 and (out[0][..., 2] == 200).all()
    chw = HWC2CHWTransformer()(img)
    assert chw.shape == (3, 20, 40) and (BGR2RGBTransformer()(chw)[0] == 200).all()  # CHW by default
    assert CHW2HWCTransformer()(chw).shape == (20, 40, 3)
    assert np.allclose(MeanTransformer(np.array([1.0, 2.0, 3.0]))(chw)[:, 0, 0], [-1, -2, 197])
    box = PadResizeTransformer((40, 40))(img)  # letterbox with 127, image centred
    assert (box[:10] == 127).all() and (box[30:] == 127).all() and (box[10:30, :, 2] == 200).all()
    nv12 = BGR2NV12Transformer(data_format="HWC")(img)
    assert nv12.shape == (30, 40) and nv12.dtype == np.uint8
    yuv = NV12ToYUV444Transformer((20, 40))(nv12)
    direct = RGB2YUV444Transformer("HWC")(img[..., ::-1].astype(np.float32))
    assert yuv.shape == (20, 40, 3) and np.abs(yuv.astype(int) - direct).max() <= 1


def test_imagenet_loader_over_a_folder_and_its_label_file(images, tmp_path):
    from horizon_tc_ui.data.dataloader import ImageNetDataLoader
    from horizon_tc_ui.data.transformer import CenterCropTransformer, ShortSideResizeTransformer

    d, names = images
    labels = tmp_path / "val.txt"
    labels.write_text("".join(f"{n} {i * 7}\n" for i, n in enumerate(reversed(names))))
    ts = [ShortSideResizeTransformer(short_size=40), CenterCropTransformer(crop_size=32)]
    batches = list(ImageNetDataLoader(ts, str(d), str(labels), imread_mode="opencv", batch_size=3,
                                      return_img_name=True))
    assert [b[0].shape for b in batches] == [(3, 32, 32, 3), (1, 32, 32, 3)]
    assert [list(b[1]) for b in batches] == [[0, 7, 14], [21]]
    assert batches[0][2] == list(reversed(names))[:3]
    single = list(ImageNetDataLoader(ts, str(d)))  # no label file: the folder in name order, label -1
    assert len(single) == len(names) and single[0][0].shape == (32, 32, 3) and single[0][1] == -1


def _write(path, doc):
    with open(path, "w") as f:
        yaml.safe_dump(doc, f)
    return path
